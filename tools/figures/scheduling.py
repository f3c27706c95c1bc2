"""Figures of the scheduler over time: continuous batching with chunked prefill, and overlap."""

from __future__ import annotations

from tools.figures.svg import AMBER, GREEN, ORANGE, PURPLE, RED, Svg, num


def fig_batching() -> str:
    """Which requests run in which scheduler step."""
    steps = 10
    # per request: its arrival step and {step: kind}; P prefill, P1/P2 chunks, D decode,
    # E last token.
    # A and B arrive together; C is long (two chunks); D arrives while C's first chunk runs.
    rows: list[tuple[str, int, dict[int, str]]] = [
        ("A", 1, {1: "P", 2: "D", 5: "D", 6: "D", 7: "E"}),
        ("B", 1, {1: "P", 2: "D", 5: "D", 6: "E"}),
        ("C", 2, {3: "P1", 4: "P2", 5: "D", 6: "D", 7: "D", 8: "D", 9: "D", 10: "E"}),
        ("D", 3, {4: "P", 5: "D", 6: "D", 7: "D", 8: "D", 9: "E"}),
    ]
    x0, y0, cw, ch = 100, 70, 67, 48
    width = x0 + steps * cw + 16
    s = Svg(
        "batching",
        width,
        480,
        "Continuous batching and chunked prefill",
        "A grid of scheduler steps against four requests. Each step runs either one prefill "
        "batch or one decode batch. Requests join the decode batch right after their prefill "
        "and leave as soon as they finish. The long request C is prefilled in two chunks; "
        "meanwhile A and B wait.",
    )
    s.text(x0 - 12, y0 - 34, "step", size=13, anchor="end", muted=True)
    kinds: dict[int, str] = {}
    for _, _, cells in rows:
        for k, v in cells.items():
            kinds[k] = "prefill" if v.startswith("P") else "decode"
    for k in range(1, steps + 1):
        cx = x0 + (k - 0.5) * cw
        s.text(cx, y0 - 34, str(k), size=15, anchor="middle", bold=True)
        color = ORANGE if kinds.get(k) == "prefill" else GREEN
        s.box(
            x0 + (k - 1) * cw + 5,
            y0 - 24,
            cw - 10,
            20,
            color,
            rx=4,
            fill_opacity=0.35,
            stroke_width=1,
        )
        s.text(cx, y0 - 9.5, kinds.get(k, ""), size=12, anchor="middle")

    # the steps where the running requests wait for a prefill
    for k in (3, 4):
        s.box(
            x0 + (k - 1) * cw + 5,
            y0 + 10,
            cw - 10,
            2 * ch - 4,
            RED,
            rx=6,
            dashed=True,
            fill_opacity=0.06,
            stroke_width=1.2,
        )
    for r, (name, arrive, cells) in enumerate(rows):
        top = y0 + 12 + r * ch
        s.text(16, top + ch / 2 + 3, f"request {name}", size=14, bold=True)
        s.line(x0, top + ch - 3, x0 + steps * cw, top + ch - 3, color=None, opacity=0.12, width=1)
        first = min(cells)
        if first > arrive:
            wx1 = x0 + (arrive - 1) * cw + 10
            wx2 = x0 + (first - 1) * cw - 4
            s.line(
                wx1, top + ch / 2 - 5, wx2, top + ch / 2 - 5, color=None, dashed=True, opacity=0.6
            )
            s.text(
                (wx1 + wx2) / 2, top + ch / 2 + 12, "waits", size=12, anchor="middle", muted=True
            )
        s.line(
            x0 + (arrive - 1) * cw + 2,
            top + 6,
            x0 + (arrive - 1) * cw + 2,
            top + ch - 10,
            color=None,
            width=2.5,
            opacity=0.8,
        )
        for k, v in cells.items():
            cx = x0 + (k - 1) * cw + 5
            color = ORANGE if v.startswith("P") else GREEN
            s.box(
                cx, top + 5, cw - 10, ch - 15, color, rx=6, fill_opacity=0.5 if v == "E" else 0.28
            )
            label = {"P": "prefill", "P1": "chunk 1", "P2": "chunk 2", "D": "token", "E": "last ✓"}[
                v
            ]
            s.text(cx + (cw - 10) / 2, top + ch / 2 + 2, label, size=12.5, anchor="middle")
    gy = y0 + 12 + len(rows) * ch
    s.text(
        x0 + 3 * cw,
        gy + 18,
        "A and B wait: a prefill step runs no decode",
        size=13,
        anchor="middle",
        color=RED,
    )

    # legend and notes
    ly = gy + 46
    s.box(x0, ly, 40, 22, ORANGE, rx=5, fill_opacity=0.28)
    s.text(
        x0 + 52, ly + 16, "prefill: a prompt, or one chunk of it, in one forward pass", size=13.5
    )
    s.box(x0, ly + 32, 40, 22, GREEN, rx=5, fill_opacity=0.28)
    s.text(x0 + 52, ly + 48, "decode: one new token for every running request", size=13.5)
    s.line(x0 + 20, ly + 66, x0 + 20, ly + 88, color=None, width=2.5, opacity=0.8)
    s.text(x0 + 52, ly + 82, "the request arrives", size=13.5)
    s.lines(
        x0,
        ly + 120,
        [
            "C's prompt is longer than the token budget of one prefill (max_extend_tokens),",
            "so it runs in two chunks; D fits in what is left in step 4 and joins that batch.",
        ],
        size=13,
        muted=True,
        gap=1.4,
    )
    return s.render()


def fig_overlap() -> str:
    """The CPU and the GPU over time, with and without overlap scheduling."""
    prep, fwd, proc = 2.5, 5.0, 2.2  # time units for one step's CPU and GPU work
    span = 2 * (prep + fwd + proc) + prep + 2.5  # two steps, then the start of the third
    lane_x, lane_w = 70, 716
    unit = lane_w / span
    s = Svg(
        "overlap",
        800,
        440,
        "Overlap scheduling",
        "Two timelines of the CPU and the GPU. Without overlap, the GPU idles while the CPU "
        "processes one step's tokens and prepares the next batch. With overlap, the CPU "
        "prepares and launches step k+1 while step k runs, and only then reads step k's tokens, "
        "so the GPU runs one forward pass after another.",
    )
    clip = f"{s.name}-clip"
    s.defs.append(
        f'<clipPath id="{clip}"><rect x="{lane_x}" y="0" width="{num(lane_w)}" '
        f'height="440"/></clipPath>'
    )

    def block(t0: float, dt: float, y: float, label: str, color: str) -> None:
        x, w = lane_x + t0 * unit, dt * unit
        s.box(x + 1, y, w - 2, 32, color, rx=5, fill_opacity=0.3, stroke_width=1.2)
        s.text(x + w / 2, y + 21, label, size=13, anchor="middle")

    def wait(t0: float, dt: float, y: float) -> None:
        x1, x2 = lane_x + t0 * unit + 6, lane_x + (t0 + dt) * unit - 6
        if x2 - x1 < 20:
            return
        s.line(x1, y + 16, x2, y + 16, color=None, dashed=True, opacity=0.5, width=1.2)
        if x2 - x1 > 56:
            s.label_bg((x1 + x2) / 2, y + 20.5, "wait", size=12.5, muted=True)

    def idle(t0: float, dt: float, y: float) -> None:
        x, w = lane_x + t0 * unit, dt * unit
        s.box(x + 1, y, w - 2, 32, RED, rx=5, dashed=True, fill_opacity=0.07, stroke_width=1)
        s.text(x + w / 2, y + 21, "idle", size=13, anchor="middle", color=RED)

    def lanes(y: float, title: str, sub: str) -> tuple[float, float]:
        s.text(8, y - 16, title, size=15, bold=True)
        s.text(170, y - 16, sub, size=13, muted=True, mono=True)
        cpu_y, gpu_y = y, y + 46
        s.text(lane_x - 12, cpu_y + 21, "CPU", size=13.5, anchor="end", bold=True)
        s.text(lane_x - 12, gpu_y + 21, "GPU", size=13.5, anchor="end", bold=True)
        for yy in (cpu_y, gpu_y):
            s.line(lane_x, yy + 34, lane_x + lane_w, yy + 34, color=None, opacity=0.2, width=1)
        return cpu_y, gpu_y

    # without overlap: prepare k, launch, wait for its tokens, process k, repeat
    cpu_y, gpu_y = lanes(62, "Without overlap", "normal_loop()")
    s.body.append(f'<g clip-path="url(#{clip})">')
    t = 0.0
    idle(0, prep, gpu_y)
    for k in (1, 2, 3):
        block(t, prep, cpu_y, f"prepare {k}", ORANGE)
        t += prep
        block(t, fwd, gpu_y, f"forward {k}", PURPLE)
        wait(t, fwd, cpu_y)
        t += fwd
        block(t, proc, cpu_y, f"process {k}", AMBER)
        idle(t, proc + prep, gpu_y)
        t += proc
    s.body.append("</g>")

    # with overlap: the CPU runs one step ahead of the GPU
    cpu_y, gpu_y = lanes(238, "With overlap", "overlap_loop(last_data)")
    s.body.append(f'<g clip-path="url(#{clip})">')
    block(0, prep, cpu_y, "prepare 1", ORANGE)
    idle(0, prep, gpu_y)
    g = prep
    for k in range(1, 6):
        block(g, fwd, gpu_y, f"forward {k}", PURPLE)
        # while forward k runs: read the tokens of step k-1, prepare and launch k+1, wait
        t = g
        if k > 1:
            block(t, proc, cpu_y, f"process {k - 1}", AMBER)
            t += proc
        block(t, prep, cpu_y, f"prepare {k + 1}", ORANGE)
        t += prep
        wait(t, g + fwd - t, cpu_y)
        g += fwd
    s.body.append("</g>")
    s.lines(
        lane_x,
        gpu_y + 66,
        [
            "Each turn of the loop launches step k+1 first and only then reads step k's",
            "tokens, so the GPU always has the next forward pass queued.",
        ],
        size=13,
        muted=True,
        gap=1.4,
    )
    s.arrow(lane_x, 418, lane_x + lane_w, 418)
    s.text(lane_x + lane_w, 436, "time", size=13, anchor="end", muted=True)
    return s.render()
