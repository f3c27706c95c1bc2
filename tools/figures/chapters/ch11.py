"""Figures of chapter 11 (overlap scheduling).

ch11-overlap-loop  the host and the device over time: normal_loop against overlap_loop
ch11-one-request   one request through launches and processing: where the finished flag
                   lands (fix 1), and the stale result after an EOS (fix 2)
"""

from __future__ import annotations

from tools.figures.svg import AMBER, GREEN, GREY, ORANGE, PURPLE, RED, Svg, num

# A "finished?" test: its code, and per turn what it answers and whether that is right (None:
# neither)
Verdicts = tuple[str, dict[int, tuple[str, bool | None]]]


def fig_overlap_loop() -> str:
    prep, launch, fwd, proc = 2.3, 0.5, 5.0, 2.0  # time units: one turn's host and device work
    lane_x, lane_w = 96, 830
    span = 19.0
    unit = lane_w / span
    s = Svg(
        "ch11-overlap-loop",
        940,
        500,
        "normal_loop against overlap_loop",
        "Two timelines of the host (the Python process) and the device. In normal_loop the host "
        "receives, schedules and prepares batch 1, launches it, waits for its tokens, processes "
        "them, and only then prepares batch 2, so the device idles while the host works. In "
        "overlap_loop the host prepares and launches batch 2 while batch 1 runs, then waits for "
        "and processes batch 1's tokens, so the device runs one batch after another. Batch 2 is "
        "chosen before batch 1's tokens are known.",
    )
    clip = f"{s.name}-clip"
    s.defs.append(
        f'<clipPath id="{clip}"><rect x="{lane_x}" y="0" width="{num(lane_w)}" '
        f'height="500"/></clipPath>'
    )

    def block(t0: float, dt: float, y: float, label: str, color: str, size: float = 12.5) -> None:
        x, w = lane_x + t0 * unit, dt * unit
        s.box(x + 1, y, w - 2, 32, color, rx=5, fill_opacity=0.3, stroke_width=1.2)
        if label:
            s.text(x + w / 2, y + 21, label, size=size, anchor="middle")

    def tick(t0: float, y: float) -> None:  # a launch: queued on the engine's stream
        x = lane_x + t0 * unit
        s.box(x + 1, y, launch * unit - 2, 32, PURPLE, rx=3, fill_opacity=0.55, stroke_width=1)

    def wait(t0: float, t1: float, y: float, label: str = "wait") -> None:
        x1, x2 = lane_x + t0 * unit + 5, lane_x + t1 * unit - 5
        if x2 - x1 < 16:
            return
        s.line(x1, y + 16, x2, y + 16, color=None, dashed=True, opacity=0.5, width=1.2)
        if x2 - x1 > 50:
            s.label_bg((x1 + x2) / 2, y + 20.5, label, size=12, muted=True)

    def idle(t0: float, t1: float, y: float) -> None:
        x, w = lane_x + t0 * unit, (t1 - t0) * unit
        s.box(x + 1, y, w - 2, 32, RED, rx=5, dashed=True, fill_opacity=0.07, stroke_width=1)
        if w > 40:
            s.text(x + w / 2, y + 21, "idle", size=12.5, anchor="middle", color=RED)

    def lanes(y: float, title: str, sub: str, title_dy: float = 16) -> tuple[float, float]:
        s.text(8, y - title_dy, title, size=15, bold=True, mono=True)
        s.text(
            8 + len(title) * 9.3 + 14,
            y - title_dy,
            sub,
            size=13,
            muted=True,
            mono=sub.isupper() or "=" in sub,
        )
        host_y, dev_y = y, y + 44
        s.text(lane_x - 10, host_y + 21, "host", size=13.5, anchor="end", bold=True)
        s.text(lane_x - 10, dev_y + 21, "device", size=13.5, anchor="end", bold=True)
        for yy in (host_y, dev_y):
            s.line(lane_x, yy + 34, lane_x + lane_w, yy + 34, color=None, opacity=0.2, width=1)
        return host_y, dev_y

    # ---- normal_loop: schedule k, launch, wait for its tokens, process k
    host_y, dev_y = lanes(52, "normal_loop()", "MINISGL_DISABLE_OVERLAP_SCHEDULING=1")
    s.body.append(f'<g clip-path="url(#{clip})">')
    t = 0.0
    for k in (1, 2, 3):
        block(t, prep, host_y, f"schedule {k}", ORANGE)
        idle(t if k == 1 else t - proc, t + prep + launch, dev_y)
        t += prep
        tick(t, host_y)
        t += launch
        block(t, fwd, dev_y, f"forward {k}", PURPLE)
        wait(t, t + fwd, host_y, f"wait for {k}")
        t += fwd
        block(t, proc, host_y, f"process {k}", AMBER)
        t += proc
    s.body.append("</g>")

    # ---- overlap_loop: launch k+1, then process k
    host_y, dev_y = lanes(246, "overlap_loop(last_data)", "the default", title_dy=46)
    s.body.append(f'<g clip-path="url(#{clip})">')
    block(0, prep, host_y, "schedule 1", ORANGE)
    tick(prep, host_y)
    idle(0, prep + launch, dev_y)
    g = prep + launch  # when the device starts forward 1
    t = g  # the host's clock
    k = 1
    while g < span:
        block(g, fwd, dev_y, f"forward {k}", PURPLE)
        block(t, prep, host_y, f"schedule {k + 1}", ORANGE)
        t += prep
        tick(t, host_y)
        t += launch
        wait(t, g + fwd, host_y)
        t = g + fwd
        block(t, proc, host_y, f"process {k}", AMBER)
        t += proc
        g += fwd
        k += 1
    s.body.append("</g>")
    # the price: batch 2 is chosen before batch 1's tokens are known
    x2 = lane_x + (prep + launch + prep / 2) * unit
    xp = lane_x + (prep + launch + fwd + proc / 2) * unit
    s.path(
        f"M{num(x2)},{host_y - 3} "
        f"C{num(x2)},{host_y - 26} {num(xp)},{host_y - 26} {num(xp)},{host_y - 3}",
        color=RED,
        dashed=True,
        width=1.3,
    )
    s.label_bg(
        (x2 + xp) / 2,
        host_y - 16,
        "batch 2 is chosen before batch 1's tokens are known",
        size=12,
        color=RED,
    )
    s.arrow(lane_x, dev_y + 48, lane_x + lane_w, dev_y + 48)
    s.text(lane_x + lane_w, dev_y + 66, "time", size=12.5, anchor="end", muted=True)

    # legend
    ly = dev_y + 92
    s.box(lane_x, ly - 12, 14, 16, ORANGE, rx=3, fill_opacity=0.3, stroke_width=1.2)
    s.text(lane_x + 20, ly + 1, "receive, schedule, prepare (scheduler's stream)", size=12.5)
    s.box(lane_x + 360, ly - 12, 8, 16, PURPLE, rx=2, fill_opacity=0.55, stroke_width=1)
    s.text(lane_x + 374, ly + 1, "launch: forward_batch queued on the engine's stream", size=12.5)
    ly += 24
    s.box(lane_x, ly - 12, 14, 16, AMBER, rx=3, fill_opacity=0.3, stroke_width=1.2)
    s.text(
        lane_x + 20,
        ly + 1,
        "process: copy_done.synchronize(), append tokens, reply, free",
        size=12.5,
    )
    ly += 30
    s.lines(
        lane_x,
        ly,
        [
            "In overlap_loop, process k waits only for forward k, and forward k+1 is already "
            "queued",
            "behind it: the device never waits for the host, as long as a turn's host work is "
            "shorter",
            "than a forward pass. On a CPU the two lanes are one: the order is the same, but "
            "nothing",
            "overlaps.",
        ],
        size=12.5,
        muted=True,
        gap=1.4,
    )
    return s.render()


def fig_one_request() -> str:
    s = Svg(
        "ch11-one-request",
        940,
        648,
        "One request under overlap scheduling: fixes 1 and 2",
        "Two timelines of one request R, by turn of overlap_loop. Top: R has max_tokens = 3. "
        "Each launch advances R's device-side length at once; batch B3's launch reaches the "
        "maximum, so when B2 is processed, upstream's test 'not can_decode' already says "
        "finished and flags the second token. Ours counts the tokens that have arrived on the "
        "host and flags the third. Bottom: R samples its EOS in B2, but B3 was launched with R "
        "before B2 was processed. Upstream sends B3's token after the EOS and has already freed "
        "R's slot while B3 runs; ours drops that token and releases R's slot and pages when B3 "
        "is processed.",
    )
    x0, cw = 150, 196  # turn columns
    turns = 4

    def header(y: float, title: str, bottom: float) -> None:
        s.text(8, y, title, size=15, bold=True)
        for k in range(turns):
            s.text(
                x0 + k * cw + cw / 2,
                y + 24,
                f"turn {k + 1}",
                size=12.5,
                anchor="middle",
                muted=True,
            )
        for k in range(turns + 1):
            s.line(x0 + k * cw, y + 32, x0 + k * cw, bottom, color=None, opacity=0.12, width=1)

    def cell(k: int, y: float, rows: list[str], color: str | None, dashed: bool = False) -> None:
        x = x0 + k * cw + 8
        s.box(x, y, cw - 16, 62, color, rx=6, dashed=dashed, fill_opacity=0.22, stroke_width=1.2)
        s.text(x + 10, y + 20, rows[0], size=13, bold=True)
        for j, row in enumerate(rows[1:]):
            s.text(x + 10, y + 37 + 15 * j, row, size=11.5, muted=True)

    def flag(k: int, y: float, text: str, good: bool | None) -> None:
        color = GREY if good is None else (GREEN if good else RED)
        w, h = min(cw - 12, len(text) * 7.0 + 22), 22
        x = x0 + k * cw + (cw - w) / 2
        s.box(x, y - h / 2, w, h, color, rx=h / 2, fill_opacity=0.3, stroke_width=1.2)
        s.text(x + w / 2, y + 4.5, text, size=12, anchor="middle", mono=True)

    def row_label(y: float, a: str, b: str = "") -> None:
        s.text(8, y, a, size=13, bold=True)
        if b:
            s.text(8, y + 16, b, size=11, muted=True, mono=True)

    def panel(
        y: float,
        title: str,
        launched: list[tuple[list[str], str | None]],
        processed: dict[int, list[str]],
        upstream: Verdicts,
        ours: Verdicts,
        note: tuple[int, int, str] | None = None,
    ) -> None:
        ly, py, uy, oy = y + 40, y + 110, y + 196, y + (268 if note else 236)
        header(y, title, oy + 24)
        row_label(ly + 24, "launched", "_forward")
        row_label(py + 24, "processed", "_process_last_data")
        row_label(uy + 4, "upstream", upstream[0])
        row_label(oy + 4, "ours", ours[0])
        for k, (rows, color) in enumerate(launched):
            cell(k, ly, rows, color, dashed=color is None)
        for k, rows in processed.items():
            cell(k, py, rows, AMBER)
        for k, (text, good) in upstream[1].items():
            flag(k, uy, text, good)
        for k, (text, good) in ours[1].items():
            flag(k, oy, text, good)
        if note:
            k1, k2, text = note
            xa, xb = x0 + k1 * cw + cw / 2, x0 + k2 * cw + cw / 2
            s.line(xa, uy + 13, xa, uy + 21, color=RED, width=1.2)
            s.line(xb, uy + 13, xb, uy + 21, color=RED, width=1.2)
            s.line(xa, uy + 21, xb, uy + 21, color=RED, width=1.2)
            s.text((xa + xb) / 2, uy + 38, text, size=12, anchor="middle", color=RED)

    panel(
        26,
        "Fix 1: R has max_tokens = 3 (a prompt of P tokens)",
        [
            (["B1 prefill", "device_len P+1"], ORANGE),
            (["B2 decode", "device_len P+2"], PURPLE),
            (["B3 decode", "device_len P+3 = max:", "filter_reqs drops R"], PURPLE),
            (["(R is not in B4)"], None),
        ],
        {
            1: ["B1 -> token 1", "host length P+1"],
            2: ["B2 -> token 2", "host length P+2"],
            3: ["B3 -> token 3", "host length P+3"],
        },
        (
            "not req.can_decode",
            {1: ("False", None), 2: ("True: too early", False), 3: ("True, again", False)},
        ),
        ("len(input_ids) >= max", {1: ("False", None), 2: ("False", None), 3: ("True", True)}),
    )
    panel(
        340,
        "Fix 2: R samples its EOS in B2",
        [
            (["B1 prefill", "R"], ORANGE),
            (["B2 decode", "R"], PURPLE),
            (["B3 decode", "R is still in it: chosen", "before B2's token arrived"], PURPLE),
            (["B4 decode", "without R"], PURPLE),
        ],
        {
            1: ["B1 -> token 1"],
            2: ["B2 -> EOS", "finished: R leaves", "the running set"],
            3: ["B3 -> one more token", "after the EOS"],
        },
        ("", {2: ("finished; slot freed", False), 3: ("sent, finished=False", False)}),
        ("", {2: ("finished; deferred", True), 3: ("dropped; released", True)}),
        note=(2, 3, "R's slot is free while B3 still uses it"),
    )
    return s.render()
