"""Figures of chapter 18 (CUDA graphs).

ch18-capture-replay  one decode step two ways: eagerly, the host launches every kernel and the GPU
                     waits for each launch; as a graph, the host copies the batch's inputs into
                     the captured buffers (copy_from, prepare_for_replay), launches one replay,
                     and the GPU runs the kernels back to back into the fixed logits buffer
ch18-padding         the captured batch sizes (1, 2, 4, then every multiple of 8 up to 256), and
                     decode batches padded with the dummy request up to the next one; a batch
                     larger than the largest graph, and every prefill batch, runs eagerly
"""

from __future__ import annotations

from collections.abc import Sequence

from tools.figures.svg import CYAN, GREEN, GREY, ORANGE, PURPLE, RED, Svg, text_width

HOST = ORANGE  # the host's work: Python launching kernels, copying inputs
KERNEL = PURPLE  # a kernel on the GPU
BUFFER = CYAN  # a fixed buffer: the same address on every replay
LANE_H = 32  # a timeline lane's height
KERNELS_PER_LAYER = 8  # drawn per layer; a real layer launches a few more
LAYERS_DRAWN = 2
NUM_LAYERS = 28


def _legend(s: Svg, y: float, items: Sequence[tuple[str | None, str, bool]]) -> None:
    """A key on one line: (colour, label, dashed); ``None`` is an uncoloured, dashed swatch."""
    x = 20.0
    for color, label, dashed in items:
        s.box(x, y - 12, 16, 16, color, rx=3, dashed=dashed, fill_opacity=0.3, stroke_width=1.1)
        s.text(x + 22, y, label, size=12.5)
        x += 22 + text_width(label, 12.5) + 26


# --------------------------------------------------------------------------- capture and replay


def fig_capture_replay() -> str:
    s = Svg(
        "ch18-capture-replay",
        940,
        598,
        "Eager decode step vs. a CUDA graph replay",
        "Two timelines of one decode step, the host above and the GPU below. Eager: the host "
        "(Python) launches every kernel of the step one after another (eight are drawn per "
        f"layer), for {NUM_LAYERS} layers, hundreds in all; each kernel is short, so the GPU "
        "finishes it and waits, idle, for the next launch. CUDA graph: the host first copies the "
        "batch's input_ids, positions and out_loc into the graph's fixed buffers "
        "(GraphCaptureBuffer, buffer.copy_from), and prepare_for_replay copies the attention "
        "metadata, the sequence lengths and the page table (for FlashInfer, its plan), into the "
        "backend's fixed buffers. Then one launch, graph.replay(), and the GPU runs all the "
        "kernels back to back with no gaps. The logits land in the fixed logits buffer, and the "
        "sampler reads its first batch.size rows. A graph replays the same kernels on the same "
        "addresses: the inputs must be copied into the captured buffers.",
    )
    s.text(20, 28, "One decode step: eager vs. a CUDA graph replay", size=15, bold=True)
    lane_x, lane_end = 96, 926

    def lanes(host_y: float, gpu_y: float) -> None:
        s.text(lane_x - 10, host_y + 21, "host", size=13.5, anchor="end", bold=True)
        s.text(lane_x - 10, gpu_y + 21, "GPU", size=13.5, anchor="end", bold=True)
        for y in (host_y, gpu_y):
            s.line(lane_x, y + LANE_H + 2, lane_end, y + LANE_H + 2, color=None, opacity=0.2)

    def kernel(x: float, y: float, w: float) -> None:
        s.box(x, y, w, LANE_H, KERNEL, rx=2, fill_opacity=0.35, stroke_width=1)

    def bracket(x1: float, x2: float, y: float, label: str, up: bool = True) -> None:
        """A muted bracket over (or under) a span, its label beyond it."""
        d = 5 if up else -5
        s.path(
            f"M{x1},{y + d} L{x1},{y} L{x2},{y} L{x2},{y + d}",
            color=GREY,
            width=1.2,
            arrow_end=False,
        )
        s.text((x1 + x2) / 2, y - 6 if up else y + 15, label, size=12, anchor="middle", muted=True)

    def more(x: float, y: float) -> None:
        s.text(x, y + LANE_H / 2 + 6, "⋯", size=18, anchor="middle", bold=True, muted=True)

    # ---- eager: one launch per kernel, the GPU waits between them
    host_y, gpu_y = 104, 148
    s.text(20, 62, "Eager", size=14.5, bold=True, color=HOST)
    s.text(
        20 + text_width("Eager", 14.5, bold=True) + 12,
        62,
        "the host (Python) launches each kernel; each kernel is short, so the GPU waits",
        size=12.5,
        muted=True,
    )
    lanes(host_y, gpu_y)
    pitch, kw = 34, 12  # one launch on the host, one kernel on the GPU
    n = KERNELS_PER_LAYER * LAYERS_DRAWN
    for i in range(n):
        x = lane_x + i * pitch
        s.box(x + 1, host_y, pitch - 2, LANE_H, HOST, rx=3, fill_opacity=0.3, stroke_width=1)
        kx = x + pitch + 1  # the kernel starts once its launch is done
        s.line(x + pitch - 2, host_y + LANE_H, kx + 2, gpu_y, color=GREY, width=1, opacity=0.7)
        kernel(kx, gpu_y, kw)
        if i + 1 < n:  # the gap until the next launch is done
            gx = kx + kw + 1
            s.box(gx, gpu_y, pitch - kw - 2, LANE_H, RED, rx=2, fill_opacity=0.08, stroke_width=0)
    for layer in range(LAYERS_DRAWN):
        x1 = lane_x + layer * KERNELS_PER_LAYER * pitch + 2
        bracket(x1, x1 + KERNELS_PER_LAYER * pitch - 4, host_y - 10, f"layer {layer}")
    end = lane_x + n * pitch
    more_x = end + 48
    more(more_x, host_y)
    more(more_x, gpu_y)
    s.text(more_x, host_y - 16, f"× {NUM_LAYERS} layers", size=12.5, anchor="middle", muted=True)
    s.lines(
        more_x + 42,
        host_y + 13,
        ["hundreds of launches", "per decode step"],
        size=12.5,
        muted=True,
    )
    s.text(
        lane_x + pitch + kw + 2,
        gpu_y + LANE_H + 22,
        "the gaps: the GPU waits for the host's next launch",
        size=12.5,
        color=RED,
    )

    # ---- a graph: copy the inputs into the captured buffers, then one replay
    host_y, gpu_y = 290, 334
    s.text(20, 240, "CUDA graph", size=14.5, bold=True, color=KERNEL)
    s.text(
        20 + text_width("CUDA graph", 14.5, bold=True) + 12,
        240,
        "the host copies the batch into the captured buffers, then launches one replay",
        size=12.5,
        muted=True,
    )
    lanes(host_y, gpu_y)

    def step(x: float, w: float, name: str, color: str = HOST, fill: float = 0.3) -> None:
        s.box(x + 1, host_y, w - 2, LANE_H, color, rx=4, fill_opacity=fill, stroke_width=1.2)
        s.text(x + w / 2, host_y + 21, name, size=12, anchor="middle", mono=True)

    copies = [("input_ids", 78), ("positions", 78), ("out_loc", 64)]
    xs = []
    x = float(lane_x)
    for name, w in copies:
        step(x, w, name)
        xs.append((x, w))
        x += w
    copies_end = x
    bracket(lane_x + 2, copies_end - 2, host_y - 10, "buffer.copy_from(batch)")
    prep_x, prep_w = copies_end + 26, 144
    step(prep_x, prep_w, "prepare_for_replay")
    bracket(prep_x + 2, prep_x + prep_w - 2, host_y - 10, "attn_backend")
    rep_x, rep_w = prep_x + prep_w + 6, 110
    step(rep_x, rep_w, "graph.replay()", KERNEL, 0.55)
    bracket(rep_x + 2, rep_x + rep_w - 2, host_y - 10, "one launch")
    free_x = rep_x + rep_w + 8
    s.line(
        free_x,
        host_y + 16,
        lane_end - 4,
        host_y + 16,
        color=None,
        dashed=True,
        opacity=0.5,
        width=1.2,
    )
    s.label_bg((free_x + lane_end) / 2, host_y + 20.5, "free", size=12, muted=True)
    # the GPU: every kernel back to back (drawn a little narrower than above, to fit)
    gk = 10
    gx0 = rep_x + rep_w + 2
    for i in range(n):
        kernel(gx0 + i * gk, gpu_y, gk - 1)
    for layer in range(LAYERS_DRAWN):
        x1 = gx0 + layer * KERNELS_PER_LAYER * gk
        bracket(x1, x1 + KERNELS_PER_LAYER * gk - 1, gpu_y + LANE_H + 8, f"layer {layer}", up=False)
    gend = gx0 + n * gk
    more(gend + 17, gpu_y)
    s.text(
        gend + 22,
        gpu_y + LANE_H + 23,
        f"× {NUM_LAYERS} layers",
        size=12,
        anchor="middle",
        muted=True,
    )
    for i in range(3):  # the last layer's end, the final norm, the LM head
        kernel(gend + 34 + i * gk, gpu_y, gk - 1)
    last_x = gend + 34 + 3 * gk
    s.text(last_x + 10, gpu_y + 21, "no gaps", size=12.5, color=KERNEL, bold=True)

    # ---- the fixed buffers: the addresses the graph was captured with
    by, bh = 424, 46  # the buffers' cells
    pad = 8

    def cell(x: float, w: float, name: str, sub: str, mono: bool = True) -> None:
        s.box(x + 1, by, w - 2, bh, BUFFER, rx=5, fill_opacity=0.22, stroke_width=1.2)
        s.text(x + w / 2, by + 19, name, size=12, anchor="middle", mono=mono)
        s.text(x + w / 2, by + 36, sub, size=11.5, anchor="middle", muted=True)

    def frame(x1: float, x2: float, label: str) -> None:
        s.box(
            x1 - pad,
            by - pad,
            x2 - x1 + 2 * pad,
            bh + 2 * pad,
            None,
            rx=10,
            dashed=True,
            stroke_width=1.1,
        )
        s.text(x1 - pad + 4, by + bh + pad + 17, label, size=12, mono=True, muted=True)

    def down(x: float, y1: float, color: str) -> None:
        s.arrow(x, y1, x, by - 3, color=color, width=1.4)

    for (x, w), (name, _) in zip(xs, copies):
        cell(x, w, name, "[max_bs]")
        down(x + w / 2, host_y + LANE_H + 3, HOST)
    frame(lane_x, copies_end, "GraphCaptureBuffer")
    cell(prep_x, prep_w, "seq lens, page table", "fi: its plan's buffers", mono=False)
    down(prep_x + prep_w / 2, host_y + LANE_H + 3, HOST)
    frame(prep_x, prep_x + prep_w, "attn_backend's buffers")
    # the logits: written by the last kernel, read by the sampler
    s.lines(
        prep_x + prep_w + 28,
        by + 19,
        ["the captured kernels read and write", "these addresses on every replay"],
        size=12.5,
        muted=True,
    )
    lg_w = 150
    lg_x = lane_end - lg_w
    cell(lg_x, lg_w, "buffer.logits", "[max_bs, vocab]")
    down(last_x - gk / 2, gpu_y + LANE_H + 3, KERNEL)
    sy = by + bh + 34
    s.arrow(lg_x + lg_w / 2, by + bh + 3, lg_x + lg_w / 2, sy - 14, width=1.4)
    s.text(lg_x + lg_w / 2, sy, "the sampler reads", size=12.5, anchor="middle", muted=True)
    s.text(lg_x + lg_w / 2, sy + 17, "logits[:batch.size]", size=12.5, anchor="middle", mono=True)

    # ---- the key idea and the key
    ky = by + bh + 58
    s.text(20, ky, "A graph replays the same kernels on the same addresses:", size=13.5, bold=True)
    s.text(20, ky + 19, "inputs must be copied into the captured buffers.", size=13.5, bold=True)
    _legend(
        s,
        ky + 52,
        [
            (HOST, "host work: a launch, a copy", False),
            (KERNEL, "a kernel on the GPU", False),
            (RED, "the GPU idle", False),
            (BUFFER, "a fixed buffer: the address the graph captured", False),
        ],
    )
    return s.render()


# --------------------------------------------------------------------------- padding


def fig_padding() -> str:
    sizes = [1, 2, 4, *range(8, 257, 8)]  # upstream's list on a GPU with room for 256
    s = Svg(
        "ch18-padding",
        940,
        490,
        "Padding a decode batch to a captured size",
        "The captured batch sizes, one CUDA graph each: 1, 2, 4, then every multiple of 8 up to "
        "256 (8, 16, 24, ... 248, 256). A decode batch of 3 real requests, r0, r1 and r2, is "
        "padded with one dummy request up to 4 and replays the graph of 4; the dummy's K/V go "
        "to the dummy page and its logits are never sampled, since the sampler reads only the "
        "rows below batch.size. A decode batch of 5 is padded with 3 dummies and replays the "
        "graph of 8. A decode batch of 300 is larger than the largest graph, 256, and runs "
        "eagerly; a prefill batch always runs eagerly.",
    )
    s.text(20, 28, "Padding a decode batch to a captured size", size=15, bold=True)
    cw, pitch, ch = 48, 54, 32  # a cell's width, the columns' pitch, a cell's height

    def slot(x: float, y: float, label: str, strong: bool = False) -> None:
        s.box(x, y, cw, ch, PURPLE, rx=5, fill_opacity=0.2, stroke_width=2.6 if strong else 1.1)
        s.text(x + cw / 2, y + 21, label, size=13, anchor="middle", mono=True, bold=strong)

    # ---- the captured sizes
    s.text(20, 64, "captured batch sizes", size=14.5, bold=True, color=PURPLE)
    s.text(
        20 + text_width("captured batch sizes", 14.5, bold=True) + 12,
        64,
        "graph_bs_list: 1, 2, 4, then every multiple of 8 up to 256; one graph each",
        size=12.5,
        muted=True,
    )
    sy = 80
    head, tail = sizes[:9], sizes[-3:]
    x = 20.0
    for bs in head:
        slot(x, sy, str(bs), strong=bs in (4, 8))
        x += pitch
    s.text(x + cw / 2 - 3, sy + 22, "⋯", size=18, anchor="middle", bold=True, muted=True)
    x += pitch
    for bs in tail:
        slot(x, sy, str(bs))
        x += pitch
    s.text(x + 4, sy + 21, "the largest: max_graph_bs", size=12.5, muted=True)

    # ---- decode batches, padded with the dummy request
    lx, cx = 20, 200  # the rows' labels, their first cell

    def label(y: float, title: str, sub: str) -> None:
        s.text(lx, y + 14, title, size=13.5, bold=True)
        s.text(lx, y + 31, sub, size=12, mono="=" in sub, muted=True)

    def req(x: float, y: float, name: str, color: str = GREEN) -> float:
        """A request's cell, ``cw`` wide or as wide as its name; returns its right edge."""
        w = max(cw, text_width(name, 13, mono=True) + 16)
        s.box(x, y, w, ch, color, rx=5, fill_opacity=0.3, stroke_width=1.1)
        s.text(x + w / 2, y + 21, name, size=13, anchor="middle", mono=True)
        return x + w

    def dummy(x: float, y: float) -> None:
        s.box(x, y, cw, ch, None, rx=5, dashed=True, stroke_width=1)
        s.text(x + cw / 2, y + 20, "dummy", size=11.5, anchor="middle", muted=True, italic=True)

    def rows(x: float, y: float, n: int) -> None:
        for i in range(n):
            s.text(x + i * pitch + cw / 2, y - 6, str(i), size=11, anchor="middle", muted=True)

    def result(x: float, y: float, text: str, color: str, why: str = "") -> None:
        s.arrow(x, y + ch / 2, x + 40, y + ch / 2, width=1.5)
        w = text_width(text, 13, bold=True) + 24
        s.box(x + 46, y, w, ch, color, rx=8, fill_opacity=0.2, stroke_width=1.4)
        s.text(x + 46 + w / 2, y + 21, text, size=13, anchor="middle", bold=True)
        if why:
            s.text(x + 46 + w + 12, y + 21, why, size=12.5, muted=True)

    # a batch of 3: one dummy, the graph of 4
    ay = 154
    label(ay, "decode batch of 3", "batch.size = 3")
    rows(cx, ay, 4)
    for i in range(3):
        req(cx + i * pitch, ay, f"r{i}")
    dx = cx + 3 * pitch
    dummy(dx, ay)
    result(dx + cw + 8, ay, "the graph of 4", PURPLE, "padded_size = 4")
    s.line(dx + cw / 2, ay + ch + 3, dx + cw / 2, ay + ch + 14, color=GREY, width=1.2)
    s.lines(
        dx + cw / 2 - 8,
        ay + ch + 30,
        [
            "the dummy: its K/V go to the dummy page;",
            "its logits are never sampled (rows >= batch.size)",
        ],
        size=12.5,
        muted=True,
    )

    # a batch of 5: three dummies, the graph of 8
    by = 276
    label(by, "decode batch of 5", "batch.size = 5")
    rows(cx, by, 8)
    for i in range(5):
        req(cx + i * pitch, by, f"r{i}")
    for i in range(5, 8):
        dummy(cx + i * pitch, by)
    result(cx + 7 * pitch + cw + 8, by, "the graph of 8", PURPLE, "padded_size = 8")

    # a batch of 300: larger than the largest graph, eagerly
    ey = 344
    label(ey, "decode batch of 300", "batch.size = 300")
    req(cx, ey, "r0")
    req(cx + pitch, ey, "r1")
    s.text(
        cx + 2 * pitch + cw / 2 - 3, ey + 22, "⋯", size=18, anchor="middle", bold=True, muted=True
    )
    end_e = req(cx + 3 * pitch, ey, "r299")

    # a prefill batch: always eagerly
    py = 404
    label(py, "prefill batch", "any size")
    end_p = req(cx, py, "r0: 12 tokens", ORANGE)
    end_p = req(end_p + pitch - cw, py, "r1: 7 tokens", ORANGE)
    rx = max(end_e, end_p) + 8
    for y, end in ((ey, end_e), (py, end_p)):
        if end + 8 < rx:
            s.line(end + 4, y + ch / 2, rx, y + ch / 2, width=1.5)
    result(rx, ey, "eagerly", GREY, "300 > 256, the largest graph: no padding")
    result(rx, py, "eagerly", GREY, "graphs are for decode batches only")

    _legend(
        s,
        472,
        [
            (GREEN, "a decode request", False),
            (None, "the dummy request", True),
            (ORANGE, "a prefill request", False),
            (PURPLE, "a captured graph", False),
            (GREY, "an eager forward", False),
        ],
    )
    return s.render()
