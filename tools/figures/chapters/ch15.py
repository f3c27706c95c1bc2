"""Figures of chapter 15 (the API server).

ch15-one-request  one streamed chat request through the server's processes, time flowing down:
                  the API server checks the body, waits for the tokenizer's count of the prompt
                  (a 400 for a bad field or a prompt too long), then streams one chunk per
                  UserReply and ends with finish_reason, usage and [DONE]; below, a client that
                  goes away aborts the request down to the scheduler
"""

from __future__ import annotations

from tools.figures.svg import (
    BLUE,
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

CLIENT, API, TOK, SCHED, DETOK = 70, 290, 500, 690, 860  # the lifelines' x


def fig_one_request() -> str:
    s = Svg(
        "ch15-one-request",
        940,
        1174,
        "One streamed chat request through the server's processes",
        "A sequence diagram, time flowing down, with five lifelines: the client (the openai "
        "library), the API server (its FrontendManager), the tokenizer worker, the scheduler and "
        "the detokenizer. The client posts to /v1/chat/completions with stream=true. The API "
        "server checks the body's fields; a bad field is answered at once with a 400, and the "
        "request never leaves the API server. Otherwise the API server sends TokenizeMsg with "
        "the uid, the messages and the sampling parameters to the tokenizer, and waits in "
        "started(). The tokenizer tokenizes the chat and first sends back a UserReply that "
        "carries only prompt_tokens, the prompt's length; only then does it send UserMsg with "
        "the uid, the input ids and the parameters to the scheduler. If the prompt, or the "
        "prompt plus max_tokens, is longer than the server takes, the client gets a 400 that "
        "says how many tokens the prompt has, and the request is aborted; otherwise the HTTP 200 "
        "response starts, a stream of server-sent events whose first chunk carries the role. "
        "For every token the scheduler makes, prefill for the first and a decode step for each "
        "later one, it sends a DetokenizeMsg to the detokenizer, which sends a UserReply with "
        "the new text to the API server, which sends the client one data: chunk; the last few "
        "characters, which could be the start of a stop string, are held back until the next "
        "reply. The last DetokenizeMsg and UserReply say finished; the finish_reason is stop "
        "at the EOS, or at a stop string, which the API server finds itself, and length when "
        "max_tokens is used up. The API server sends a chunk with the finish_reason, a usage "
        "chunk if the client asked for it, and data: [DONE]. "
        "Below, a separate band: when the client goes away, the API server notices the closed "
        "connection and sends AbortMsg with the uid to the tokenizer, which sends "
        "AbortBackendMsg to the scheduler, which frees the request's pages and its slot. A "
        "stop string and a prompt that is too long end the request the same way.",
    )
    first = len(s.body)  # the lifelines go here, under everything else

    def msg(
        x1: float,
        x2: float,
        y: float,
        label: str,
        sub: str = "",
        at: float | None = None,
        color: str | None = None,
        dashed: bool = False,
        mono: bool = False,
        quiet: bool = False,
        sub_mono: bool = False,
    ) -> None:
        """A message from lifeline ``x1`` to ``x2``: its name above the arrow, ``sub`` below,
        both centred on ``at`` (by default the arrow's middle)."""
        d = 1 if x2 > x1 else -1
        s.arrow(x1 + d * 3, y, x2 - d * 7, y, color=color, dashed=dashed, width=1.6)
        cx = (x1 + x2) / 2 if at is None else at
        if quiet:
            s.text(cx, y - 7, label, size=11.5, anchor="middle", mono=mono, muted=True)
        else:
            s.text(
                cx, y - 7, label, size=12, anchor="middle", mono=mono, bold=not mono, color=color
            )
        if sub:
            s.text(cx, y + 16, sub, size=11.5, anchor="middle", mono=sub_mono, muted=True)

    def event(
        x: float, y: float, label: str, color: str, fill: float = 0.25, mono: bool = True
    ) -> float:
        """A call on lifeline ``x``, centred on it; returns its right edge."""
        w = text_width(label, 12, mono=mono) + 16
        s.box(
            x - w / 2,
            y - 13,
            w,
            26,
            color,
            rx=5,
            fill_opacity=fill,
            stroke_width=1.2,
            solid_bg=True,
        )
        s.text(x, y + 4.5, label, size=12, anchor="middle", mono=mono)
        return x + w / 2

    def lifelines(y1: float, y2: float) -> list[str]:
        """The dashed lifelines from ``y1`` to ``y2``, to go under everything else."""
        return [
            f'<path d="M{num(x)},{num(y1)} L{num(x)},{num(y2)}" fill="none" class="fg-stroke" '
            f'stroke="{FALLBACK_FG}" stroke-opacity="0.4" stroke-width="1.2" '
            f'stroke-dasharray="5 4"/>'
            for x in (CLIENT, API, TOK, SCHED, DETOK)
        ]

    def frame(y1: float, y2: float, tag: str, sub: str) -> None:
        """A band with a tag in its top left corner, as in a UML sequence diagram."""
        lx1, lx2 = 8, 932
        s.box(lx1, y1, lx2 - lx1, y2 - y1, None, rx=8, stroke_width=1.2)
        tw = text_width(tag, 13.5, bold=True) * 1.12 + 22
        s.body.append(
            f'<path d="M{lx1},{num(y1 + 8)} a8,8 0 0 1 8,-8 H{num(lx1 + tw)} v18 l-9,9 H{lx1} z" '
            f'fill="{RED}" fill-opacity="0.2" stroke="{RED}" stroke-width="1.2"/>'
        )
        s.text(lx1 + 9, y1 + 19, tag, size=13.5, bold=True)
        s.text(lx1 + tw + 12, y1 + 19, sub, size=12.5, muted=True)

    # ---- title and heads
    title = "One streamed chat request"
    s.text(8, 28, title, size=15, bold=True)
    s.text(
        8 + 1.2 * text_width(title, 15, bold=True) + 18,
        28,
        "through the server's processes; time flows down",
        size=13,
        muted=True,
    )
    head_y, head_h = 44, 46
    heads = (
        (CLIENT, "client (openai)", "HTTP, SSE", GREY, False),
        (API, "API server", "FrontendManager", BLUE, True),
        (TOK, "tokenizer worker", "text → token ids", TEAL, False),
        (SCHED, "scheduler", "rank 0", ORANGE, False),
        (DETOK, "detokenizer", "token ids → text", TEAL, False),
    )

    # ---- 1: the request, and the fields' check
    msg(CLIENT, API, 124, "POST /v1/chat/completions", "messages, stream=true", mono=True)
    event(API, 166, "check_fields()", BLUE)
    msg(
        API,
        CLIENT,
        204,
        "bad field → 400",
        "it never leaves the API server",
        color=RED,
        dashed=True,
    )

    # ---- 2, 3: tokenize; the count comes back before the request goes on
    msg(API, TOK, 250, "TokenizeMsg", "(uid, messages, params)", sub_mono=True)
    s.box(
        API - 6,
        258,
        12,
        70,
        GREY,
        rx=3,
        dashed=True,
        fill_opacity=0.12,
        stroke_width=1.1,
        solid_bg=True,
    )
    s.text(API - 14, 286, "started()", size=12, anchor="end", mono=True)
    s.text(API - 14, 302, "waits for the count", size=11.5, anchor="end", muted=True)
    event(TOK, 290, "tokenize", TEAL)
    msg(TOK, API, 330, "UserReply", "only prompt_tokens, the count")
    msg(TOK, SCHED, 370, "UserMsg", "(uid, input_ids, params)", sub_mono=True)
    s.text((TOK + SCHED) / 2, 402, "sent after the count", size=11.5, anchor="middle", muted=True)
    event(API, 372, "fits max_seq_len?", BLUE)
    msg(API, CLIENT, 412, "too long → 400", color=RED, dashed=True)
    s.lines(
        (CLIENT + API) / 2,
        428,
        ['"the prompt has N tokens; …"', "and the request is aborted"],
        size=11.5,
        anchor="middle",
        muted=True,
        gap=1.4,
    )
    msg(API, CLIENT, 484, "else: HTTP 200, the stream starts", "first chunk: the role", color=GREEN)

    # ---- 4, 5: one DetokenizeMsg, one UserReply, one chunk per token
    reply_at = (API + TOK) / 2  # the UserReply labels sit between the API server and tokenizer
    sched_top = 376  # the scheduler holds the request from here to its last token
    for y, step, quiet in ((526, "prefill", False), (622, "decode", True)):
        right = event(SCHED, y, step, ORANGE)
        msg(right - 3, DETOK, y, "DetokenizeMsg", "" if quiet else "one per token", quiet=quiet)
        msg(
            DETOK,
            API,
            y + 26,
            "UserReply",
            "" if quiet else "(incremental_output)",
            at=reply_at,
            quiet=quiet,
            sub_mono=True,
        )
        msg(API, CLIENT, y + 52, "data: {chunk}", mono=True, quiet=quiet)
    # the held-back text, between the first chunk and the second
    nx, ny, nw, nh = (CLIENT + API) / 2 - 86, 590, 172, 54
    s.box(nx, ny, nw, nh, None, rx=6, dashed=True, stroke_width=1)
    s.lines(
        nx + nw / 2,
        ny + 16,
        ["the last characters, if they", "could begin a stop string,", "wait for the next reply"],
        size=11.5,
        anchor="middle",
        muted=True,
        gap=1.3,
    )
    for x in ((CLIENT + API) / 2, reply_at, (SCHED + DETOK) / 2 + 16):
        s.text(x, 716, "⋮", size=18, anchor="middle", muted=True)

    # ---- 6, 7: the last token; finish_reason, usage, [DONE]
    y = 746
    right = event(SCHED, y, "decode", ORANGE)
    msg(right - 3, DETOK, y, "DetokenizeMsg", "finished")
    msg(DETOK, API, y + 26, "UserReply", "finished, finish_reason", at=reply_at, sub_mono=True)
    msg(API, CLIENT, y + 56, "data: {…, finish_reason}", mono=True)
    msg(API, CLIENT, y + 84, "data: {usage}", "if include_usage", mono=True)
    msg(API, CLIENT, y + 130, "data: [DONE]", mono=True)
    s.lines(
        reply_at,
        y + 62,
        [
            '"stop": the EOS, or a stop string',
            "(which the API server finds)",
            '"length": max_tokens used up',
        ],
        size=11.5,
        anchor="middle",
        muted=True,
        gap=1.4,
    )
    end_y = y + 148
    # under everything: the lifelines, then the scheduler's hold on the request
    s.body[first:first] = [
        *lifelines(head_y + head_h, end_y),
        f'<rect x="{SCHED - 5}" y="{sched_top}" width="10" height="{num(y - sched_top)}" rx="2" '
        f'fill="{ORANGE}" fill-opacity="0.35" stroke="{ORANGE}" stroke-width="1.1"/>',
    ]
    for x, name, role, color, mono in heads:
        w = max(text_width(name, 13.5, bold=True), text_width(role, 11.5, mono=mono)) + 24
        s.box(x - w / 2, head_y, w, head_h, color, solid_bg=True)
        s.text(x, head_y + 20, name, size=13.5, anchor="middle", bold=True)
        s.text(x, head_y + 37, role, size=11.5, anchor="middle", muted=True, mono=mono)

    # ---- 8: the client goes away
    b, bh = end_y + 22, 196
    frame(
        b,
        b + bh,
        "the client goes away",
        "at any time before the end; a stop string, or a "
        "prompt too long, ends the request the same way",
    )
    s.body.extend(lifelines(b + 40, b + bh - 10)[:4])  # no detokenizer here
    r1 = b + 60
    # the client's end: a red cross on its lifeline
    for dy in (-1, 1):
        s.line(CLIENT - 7, r1 - 7 * dy, CLIENT + 7, r1 + 7 * dy, color=RED, width=2.4)
    left = API - (text_width("is_disconnected()", 12, mono=True) + 16) / 2
    s.line(CLIENT + 12, r1, left - 4, r1, color=RED, dashed=True, width=1.4)
    s.text(
        (CLIENT + left) / 2, r1 - 7, "closes the connection", size=11.5, anchor="middle", color=RED
    )
    event(API, r1, "is_disconnected()", BLUE)
    msg(API, TOK, b + 98, "AbortMsg", "(uid)", sub_mono=True)
    msg(TOK, SCHED, b + 132, "AbortBackendMsg", "(uid)", sub_mono=True)
    sx = event(SCHED, b + 170, "frees its pages and slot", ORANGE, mono=False)
    s.text(sx + 10, b + 166, "now, or after the", size=11.5, muted=True)
    s.text(sx + 10, b + 180, "batch in flight", size=11.5, muted=True)

    # ---- legend
    ly = b + bh + 28
    s.text(
        8,
        ly,
        "Solid: HTTP between the client and the API server; a ZMQ message (PUSH → PULL) "
        "between processes. Red dashed: the request ends early.",
        size=12.5,
        muted=True,
    )
    s.text(
        8,
        ly + 20,
        "The tokenizer and the detokenizer are one process by default (chapter 13); they are "
        "drawn apart here.",
        size=12.5,
        muted=True,
    )
    s.height = ly + 34
    return s.render()
