"""Figures of chapter 12 (messages and ZMQ).

ch12-sockets      the server's processes and the ZMQ queues between them: for each queue the
                  socket pair, the message types it carries, and which side binds; below, the
                  path of one message: encoder, dict, msgpack bytes, decoder
ch12-slow-joiner  rank 0 publishes, rank 1 subscribes: a plain PUB drops what it sends before
                  the subscription has arrived; our XPUB waits for it
"""

from __future__ import annotations

from tools.figures.svg import (
    AMBER,
    BLUE,
    FALLBACK_BG,
    FALLBACK_FG,
    GREEN,
    GREY,
    ORANGE,
    RED,
    TEAL,
    Svg,
    num,
    text_width,
)


def _dot(s: Svg, x: float, y: float, binds: bool, r: float = 4.5) -> None:
    """A socket on a box's edge: filled where it binds (create=True), hollow where it connects."""
    geo = f'cx="{num(x)}" cy="{num(y)}" r="{num(r)}"'
    if binds:
        s.body.append(f'<circle {geo} class="fg" fill="{FALLBACK_FG}"/>')
    else:
        s.body.append(
            f'<circle {geo} class="bg fg-stroke" fill="{FALLBACK_BG}" stroke="{FALLBACK_FG}" '
            f'stroke-width="1.6"/>'
        )


def fig_sockets() -> str:
    s = Svg(
        "ch12-sockets",
        940,
        800,
        "The server's processes and the ZMQ queues between them",
        "Five kinds of process joined by ZMQ queues, each a pair of sockets. The API server "
        "pushes TokenizeMsg and AbortMsg to the tokenizer worker's PULL socket. The tokenizer "
        "pushes UserMsg, AbortBackendMsg and ExitMsg, batched in a BatchBackendMsg, to "
        "scheduler rank 0. Rank 0 forwards the same raw bytes, unchanged, over XPUB to SUB to "
        "the schedulers of ranks 1 to n-1. Rank 0 pushes DetokenizeMsg, batched in a "
        "BatchTokenizerMsg, to the detokenizer, which pushes UserReply, batched in a "
        "BatchFrontendMsg, to the API server. A filled dot marks the side that binds the "
        "address (create=True): the API server's reply socket, the tokenizer's and the "
        "detokenizer's inbound sockets, and rank 0's backend and broadcast sockets; a hollow "
        "dot marks the side that connects. Below: every message goes through its class's "
        "encoder to a dict of plain values, through msgpack to bytes, and back through msgpack "
        "and the decoder; a tensor travels as its dtype, its shape and its raw bytes.",
    )
    top, bottom = 103, 343  # the request row and the reply row of arrows
    api_x, api_w = 16, 150
    mid_x, mid_w = 385, 160
    sch_x, sch_w = 770, 154
    box_top, box_bot = 38, 408
    api_r, mid_r = api_x + api_w, mid_x + mid_w

    # ---- the processes
    cx = api_x + api_w / 2
    s.box(api_x, box_top, api_w, box_bot - box_top, BLUE)
    s.text(cx, box_top + 28, "API server", size=16, anchor="middle", bold=True)
    s.text(cx, box_top + 47, "the frontend", size=13, anchor="middle", muted=True)
    s.lines(
        cx,
        196,
        ["a uid per request,", "replies per uid,", "streams them out"],
        size=13,
        anchor="middle",
        muted=True,
        gap=1.45,
    )
    s.text(cx, top + 27, "ZmqAsyncPushQueue", size=11.5, anchor="middle", mono=True)
    s.text(cx, bottom + 27, "ZmqAsyncPullQueue", size=11.5, anchor="middle", mono=True)

    # tokenizer and detokenizer: one process by default
    mcx = mid_x + mid_w / 2
    s.box(
        mid_x - 10,
        box_top - 12,
        mid_w + 20,
        box_bot - box_top + 24,
        None,
        rx=14,
        dashed=True,
        stroke_width=1.1,
    )
    s.text(mcx, 218, "one process", size=13, anchor="middle", muted=True)
    s.text(mcx, 235, "by default", size=13, anchor="middle", muted=True)
    for y, title, sub, job in (
        (box_top, "tokenizer", "worker(s)", "text → token ids"),
        (box_bot - 130, "detokenizer", "worker", "token ids → text"),
    ):
        s.box(mid_x, y, mid_w, 130, TEAL)
        s.text(mcx, y + 26, title, size=16, anchor="middle", bold=True)
        s.text(mcx, y + 44, sub, size=13, anchor="middle", muted=True)
        s.text(mcx, y + 71, "ZmqPullQueue in", size=11.5, anchor="middle", mono=True)
        s.text(mcx, y + 89, "ZmqPushQueue out", size=11.5, anchor="middle", mono=True)
        s.text(mcx, y + 115, job, size=13, anchor="middle", muted=True)

    # scheduler rank 0
    scx = sch_x + sch_w / 2
    s.box(sch_x, box_top, sch_w, box_bot - box_top, ORANGE)
    s.text(scx, box_top + 28, "scheduler", size=16, anchor="middle", bold=True)
    s.text(scx, box_top + 47, "rank 0", size=13, anchor="middle", muted=True)
    s.text(sch_x + 14, top + 25, "ZmqPullQueue", size=11.5, mono=True)
    s.lines(
        scx,
        184,
        ["reads each message", "as raw bytes,", "forwards them,", "then decodes"],
        size=13,
        anchor="middle",
        muted=True,
        gap=1.45,
    )
    s.text(sch_x + 14, bottom + 25, "ZmqPushQueue", size=11.5, mono=True)
    s.text(sch_x + 14, box_bot - 12, "ZmqPubQueue", size=11.5, mono=True)

    # the other ranks, a stack of cards
    ry, rh = 488, 92
    for off in (12, 6):
        s.box(sch_x + off, ry + off, sch_w - 12, rh, ORANGE, solid_bg=True, fill_opacity=0.1)
    s.box(sch_x, ry, sch_w - 12, rh, ORANGE, solid_bg=True)
    rcx = sch_x + (sch_w - 12) / 2
    s.text(rcx, ry + 24, "scheduler", size=15, anchor="middle", bold=True)
    s.text(rcx, ry + 42, "ranks 1 … n-1", size=13, anchor="middle", muted=True)
    s.text(rcx, ry + 59, "tensor parallel", size=12.5, anchor="middle", muted=True)
    s.text(rcx, ry + 80, "ZmqSubQueue", size=11.5, anchor="middle", mono=True)

    # ---- the queues: sender x, receiver x, y, message types, socket pair, batch class
    def queue(x1: float, x2: float, y: float, names: list[str], pair: str, batch: str = "") -> None:
        step = 5 if x2 > x1 else -5  # stop at the receiver's dot
        s.arrow(x1, y, x2 - step, y, width=1.7)
        m = (x1 + x2) / 2
        base = y - 9 - 17 * (len(names) - 1)
        for i, n in enumerate(names):
            s.text(m, base + 17 * i, n, size=13, anchor="middle", bold=True)
        s.text(m, y + 19, pair, size=12, anchor="middle", muted=True, mono=True)
        if batch:
            s.text(m, y + 36, f"batched as {batch}", size=12, anchor="middle", muted=True)

    queue(api_r, mid_x, top, ["TokenizeMsg", "AbortMsg"], "PUSH → PULL")
    queue(
        mid_r,
        sch_x,
        top,
        ["UserMsg", "AbortBackendMsg", "ExitMsg"],
        "PUSH → PULL",
        "BatchBackendMsg",
    )
    queue(sch_x, mid_r, bottom, ["DetokenizeMsg"], "PULL ← PUSH", "BatchTokenizerMsg")
    queue(mid_x, api_r, bottom, ["UserReply"], "PULL ← PUSH", "BatchFrontendMsg")
    # the broadcast: down from rank 0 to the other ranks
    px = sch_x + 30
    s.arrow(px, box_bot, px, ry - 5, width=1.7)
    s.text(px - 12, 435, "the same bytes, unchanged", size=13, anchor="end", bold=True)
    s.text(px - 12, 453, "XPUB → SUB", size=12, anchor="end", muted=True, mono=True)
    s.text(px - 12, 470, "forwarded with put_raw", size=12, anchor="end", muted=True)

    # the sockets: filled where the address is bound
    for x, y, binds in (
        (api_r, top, False),
        (mid_x, top, True),  # API server -> tokenizer
        (mid_r, top, False),
        (sch_x, top, True),  # tokenizer -> rank 0
        (sch_x, bottom, False),
        (mid_r, bottom, True),  # rank 0 -> detokenizer
        (mid_x, bottom, False),
        (api_r, bottom, True),  # detokenizer -> API server
        (px, box_bot, True),
        (px, ry, False),  # rank 0 -> ranks 1 .. n-1
    ):
        _dot(s, x, y, binds)

    # ---- legend
    lx, ly = api_x + 8, 454
    _dot(s, lx, ly - 4, True)
    s.text(lx + 14, ly, "binds the address (create=True): the side that lives longest", size=13)
    _dot(s, lx, ly + 20, False)
    s.text(lx + 14, ly + 24, "connects to it (create=False)", size=13)
    s.arrow(lx - 6, ly + 44, lx + 8, ly + 44, width=1.7)
    s.text(lx + 14, ly + 48, "one queue: a socket at each end, bytes one way only", size=13)
    s.text(
        lx - 8,
        ly + 78,
        "PUSH → PULL: many may push, one pulls; XPUB → SUB: every",
        size=12.5,
        muted=True,
    )
    s.text(
        lx - 8,
        ly + 96,
        "subscriber gets every message (our XPUB waits until they are all in)",
        size=12.5,
        muted=True,
    )

    # ---- the wire: one message from the sender's class back to the same class
    iy = 608
    s.box(api_x, iy, sch_x + sch_w - api_x, 180, None, rx=10, stroke_width=1)
    s.text(api_x + 14, iy + 24, "On the wire: every message, on every queue", size=14, bold=True)
    chips = [
        ("UserMsg", "a dataclass", AMBER, 110),
        ("dict", "plain values", GREY, 110),
        ("msgpack bytes", "through the socket", GREY, 150),
        ("dict", "plain values", GREY, 110),
        ("UserMsg", "made again", AMBER, 110),
    ]
    arrows = ["encoder", "packb", "unpackb", "decoder"]
    gap = 70
    total = sum(c[3] for c in chips) + gap * len(arrows)
    x = api_x + (sch_x + sch_w - api_x - total) / 2
    cy = iy + 38
    for i, (name, sub, color, w) in enumerate(chips):
        s.box(x, cy, w, 44, color, rx=8, fill_opacity=0.22, stroke_width=1.2)
        s.text(x + w / 2, cy + 18, name, size=13, anchor="middle", bold=True)
        s.text(x + w / 2, cy + 35, sub, size=11.5, anchor="middle", muted=True)
        x += w
        if i < len(arrows):
            s.arrow(x + 4, cy + 22, x + gap - 4, cy + 22, width=1.4)
            s.text(x + gap / 2, cy + 15, arrows[i], size=12, anchor="middle", mono=True)
            x += gap
    dy = cy + 72
    s.text(api_x + 14, dy, "the dict of a UserMsg with a 1000-token prompt:", size=12.5, muted=True)
    s.lines(
        api_x + 14,
        dy + 20,
        [
            '{"__type__": "UserMsg", "uid": 7,',
            (
                ' "input_ids": {"__type__": "Tensor", "dtype": "int32", "shape": [1000],'
                ' "buffer": <4000 raw bytes>},'
            ),
            ' "sampling_params": {"__type__": "SamplingParams", "temperature": 0.0, ...}}',
        ],
        size=11.5,
        mono=True,
        gap=1.45,
    )
    return s.render()


def fig_slow_joiner() -> str:
    s = Svg(
        "ch12-slow-joiner",
        940,
        546,
        "The slow joiner: a plain PUB against an XPUB that waits",
        "Two timelines on one time axis, each with rank 0, the publisher, and rank 1, the "
        "subscriber. Top, a plain PUB as upstream uses it: rank 1's connect() returns at once, "
        "but its subscription reaches rank 0 a little later. Rank 0's put(m1) falls in between: "
        "no subscriber is known yet, so the message is dropped and rank 1 never gets it; m2, "
        "sent after the subscription arrived, is delivered. Bottom, our XPUB: put(m1) first "
        "calls wait_for_subscribers(), which blocks until it reads the subscription event, the "
        "byte 1, and only then sends; rank 1 gets m1 and m2.",
    )
    lane_x, lane_r = 140, 920
    t_bind, t_conn, t_put1, t_arrive, t_put2 = 150, 250, 370, 560, 720
    conn_w, put_w = 90, 66
    got1, got2 = (586, 706), (790, 890)  # rank 1's boxes for m1 and m2
    sep = 110  # rank 0's lane to rank 1's
    panels = (28, 264)  # titles' baselines
    axis_y = 488
    # the panels' subtitles line up, well clear of the longer title
    sub_x = 8 + 1.2 * text_width("An XPUB that waits (ours)", 15, bold=True) + 12

    # the shared moments, across both panels
    for x in (t_conn, t_arrive):
        s.line(x, panels[0] + 14, x, axis_y, color=None, dashed=True, opacity=0.25, width=1)

    def event(x: float, y: float, w: float, label: str, color: str | None = None) -> None:
        s.box(x, y - 13, w, 26, color, rx=5, fill_opacity=0.25, stroke_width=1.2, solid_bg=True)
        s.text(x + w / 2, y + 4.5, label, size=12, anchor="middle", mono=True)

    def message(x1: float, y1: float, x2: float, y2: float, label: str) -> None:
        s.arrow(x1, y1, x2, y2, width=1.6)
        s.label_bg(x1 + (x2 - x1) * 0.45 + 12, y1 + (y2 - y1) * 0.45 + 4, label, size=12, bold=True)

    def panel(y: float, title: str, sub: str, sock: str, waits: bool) -> None:
        r0, r1 = y + 50, y + 50 + sep
        s.text(8, y, title, size=15, bold=True)
        s.text(sub_x, y, sub, size=13, muted=True)
        for ly, name, role in (
            (r0, "rank 0", f"publisher, {sock}"),
            (r1, "rank 1", "subscriber, SUB"),
        ):
            s.text(8, ly - 2, name, size=13.5, bold=True)
            s.text(8, ly + 14, role, size=11.5, muted=True)
            s.line(lane_x, ly, lane_r, ly, color=None, opacity=0.3, width=1.2)
        event(t_bind, r0, 56, "bind()")
        event(t_conn, r1, conn_w, "connect()")
        s.text(
            t_conn + conn_w / 2, r1 + 30, "returns at once", size=12, anchor="middle", muted=True
        )
        # the subscription: ZMQ sends it by itself after connect() returned
        sx1, sy1, sx2, sy2 = t_conn + conn_w - 6, r1 - 13, t_arrive, r0 + 13
        s.path(f"M{num(sx1)},{sy1} L{num(sx2)},{sy2}", color=None, dashed=True, width=1.4)
        f = 0.3
        s.label_bg(
            sx1 + (sx2 - sx1) * f,
            sy1 + (sy2 - sy1) * f + 4,
            'subscription: b"\\x01"' if waits else "subscription",
            size=12,
            muted=True,
        )
        event(t_put1, r0, put_w, "put(m1)")
        if waits:
            # put() -> wait_for_subscribers() blocks until the subscription event is read
            wx = t_put1 + put_w
            s.box(
                wx,
                r0 - 11,
                t_arrive - wx,
                22,
                GREY,
                rx=4,
                dashed=True,
                fill_opacity=0.12,
                stroke_width=1.1,
            )
            s.text((wx + t_arrive) / 2, r0 + 4.5, "blocks", size=12, anchor="middle", muted=True)
            s.label_bg((wx + t_arrive) / 2, r0 - 20, "wait_for_subscribers()", size=12, mono=True)
            event(t_arrive, r0, 44, "send", AMBER)
            message(t_arrive + 22, r0 + 13, sum(got1) / 2, r1 - 13, "m1")
            event(got1[0], r1, got1[1] - got1[0], "get(): m1", GREEN)
        else:
            # a plain PUB: no subscriber known yet, so the message goes nowhere
            xx, xy = t_put1 + put_w / 2, r0 + 36
            s.line(xx, r0 + 13, xx, xy - 8, color=RED, width=1.6)
            for d in (-1, 1):
                s.line(xx - 6, xy - 6 * d, xx + 6, xy + 6 * d, color=RED, width=2.4)
            s.label_bg(
                xx - 14,
                xy + 4.5,
                "no subscriber known yet: dropped",
                size=12,
                anchor="end",
                color=RED,
            )
            s.box(
                got1[0],
                r1 - 13,
                got1[1] - got1[0],
                26,
                RED,
                rx=5,
                dashed=True,
                fill_opacity=0.06,
                stroke_width=1.1,
                solid_bg=True,
            )
            s.text(sum(got1) / 2, r1 + 4.5, "m1 never comes", size=12, anchor="middle", color=RED)
        event(t_put2, r0, put_w, "put(m2)")
        message(t_put2 + put_w / 2, r0 + 13, sum(got2) / 2, r1 - 13, "m2")
        event(got2[0], r1, got2[1] - got2[0], "get(): m2", GREEN)

    panel(
        panels[0],
        "A plain PUB (upstream)",
        "send() goes to the subscribers known so far",
        "PUB",
        waits=False,
    )
    panel(
        panels[1],
        "An XPUB that waits (ours)",
        "put() first waits for num_subscribers",
        "XPUB",
        waits=True,
    )

    s.arrow(lane_x, axis_y, lane_r, axis_y, width=1.4)
    s.text(lane_r, axis_y + 18, "time", size=12.5, anchor="end", muted=True)
    s.text(t_conn, axis_y + 18, "connect() returns", size=12.5, anchor="middle", muted=True)
    s.text(
        t_arrive, axis_y + 18, "the subscription arrives", size=12.5, anchor="middle", muted=True
    )
    s.text(
        8,
        axis_y + 46,
        "Dashed: the subscription, which the SUB socket sends by itself once "
        "it is connected. Solid: a message sent with put().",
        size=12.5,
        muted=True,
    )
    return s.render()
