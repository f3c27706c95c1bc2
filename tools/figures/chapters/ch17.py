"""Figures of chapter 17 (GPU attention).

ch17-three-tables  two requests' keys with page_size 4, described three ways: the engine's page
                   table (one KV slot per position), FlashInfer's flat indices with kv_indptr and
                   last_page_len (pages of one slot), FlashAttention's page table of page numbers
                   (every 4th slot // 4, padded) with cache_seqlens
ch17-plan-run      one batch through L layers: FlashInfer's prepare_metadata on the host, plan
                   once at layer 0's attention, then one run per layer; below, the torch backend
                   of chapter 05, whose every layer gathers its keys into a padded rectangle
"""

from __future__ import annotations

from collections.abc import Sequence

from tools.figures.svg import GREY, ORANGE, PURPLE, TEAL, Svg, text_width

PAGE_SIZE = 4
# (name, the page-table row: one KV slot per position, colour)
REQS = [
    ("A", [8, 9, 10, 11, 20, 21], ORANGE),
    ("B", [28, 29, 30], TEAL),
]
CELL_H = 32


def _cell(
    s: Svg,
    x: float,
    y: float,
    w: float,
    label: str,
    color: str | None,
    strong: bool = False,
) -> None:
    """One table entry; ``color=None`` is padding (dashed, muted)."""
    if color is None:
        s.box(x, y, w, CELL_H, None, rx=5, dashed=True, stroke_width=1)
        s.text(x + w / 2, y + 21, label, size=12, anchor="middle", muted=True, italic=True)
        return
    s.box(x, y, w, CELL_H, color, rx=5, fill_opacity=0.3, stroke_width=2.6 if strong else 1.1)
    s.text(x + w / 2, y + 21, label, size=13.5, anchor="middle", mono=True, bold=strong)


def _header(s: Svg, x: float, y: float, title: str, sub: str) -> None:
    """A panel's name, and one muted line under it."""
    s.text(x, y, title, size=14.5, bold=True)
    s.text(x, y + 19, sub, size=12.5, muted=True)


# --------------------------------------------------------------------------- three tables


def fig_three_tables() -> str:
    s = Svg(
        "ch17-three-tables",
        940,
        500,
        "Two requests' keys, described three ways",
        "Two requests with page_size 4. Request A has 6 keys in KV slots 8, 9, 10, 11 (page 2) "
        "and 20, 21 (the first two slots of page 5); request B has 3 keys in slots 28, 29, 30 "
        "(page 7). (a) The engine's page table has one row per request and one entry per "
        "position, the KV slot: A reads 8 9 10 11 20 21, B reads 28 29 30. (b) FlashInfer, "
        "backend fi, sees the pool as pages of one slot: indices is every slot of the batch, "
        "A's row then B's row, 8 9 10 11 20 21 28 29 30; kv_indptr 0 6 9 marks where each "
        "request's slots start and end; last_page_len is 1 1, since every page holds one token. "
        "(c) FlashAttention, backend fa, gets a page table of page numbers, one row per request "
        "padded to the longest: the slot at every 4th position divided by 4, so A's row is "
        "2 5 (8 // 4, 20 // 4) and B's row is 7 (28 // 4) and padding; cache_seqlens 6 3 says "
        "how many keys each request has.",
    )
    s.text(20, 28, "Two requests' keys, described three ways (page_size 4)", size=15, bold=True)
    pitch, cw = 46, 42  # a column's pitch and a cell's width
    rows_y = (112, 152)  # A's and B's rows in (a) and (c)
    width = max(len(slots) for _, slots, _ in REQS)  # the longest request's keys

    # ---- (a) the engine's page table
    ax = 70
    _header(s, 20, 62, "(a) the engine's page table (chapter 04)", "one KV slot per position")
    s.text(ax - 12, rows_y[0] - 8, "position", size=12, anchor="end", muted=True)
    for c in range(width):
        s.text(ax + c * pitch + cw / 2, rows_y[0] - 8, str(c), size=12, anchor="middle", muted=True)
    for (name, slots, color), y in zip(REQS, rows_y):
        s.text(ax - 12, y + 21, name, size=14, anchor="end", bold=True, color=color)
        for c, slot in enumerate(slots):
            _cell(s, ax + c * pitch, y, cw, str(slot), color, strong=c % PAGE_SIZE == 0)
        pages = ", ".join(str(slot // PAGE_SIZE) for slot in slots[::PAGE_SIZE])
        label = f"page{'s' if ',' in pages else ''} {pages}"
        s.text(ax + width * pitch + 8, y + 21, label, size=13, mono=True, color=color)

    # ---- (c) FlashAttention: page numbers, padded to the longest request
    cx, cache_x = 610, 800
    _header(s, 560, 62, '(c) FlashAttention, backend "fa"', "page numbers, padded to the longest")
    s.text(cx + pitch, rows_y[0] - 8, "page_table", size=12.5, anchor="middle", mono=True)
    s.text(cache_x + cw / 2, rows_y[0] - 8, "cache_seqlens", size=12.5, anchor="middle", mono=True)
    for (name, slots, color), y in zip(REQS, rows_y):
        s.text(cx - 12, y + 21, name, size=14, anchor="end", bold=True, color=color)
        firsts = slots[::PAGE_SIZE]
        for i in range(-(-width // PAGE_SIZE)):
            if i < len(firsts):
                _cell(s, cx + i * pitch, y, cw, str(firsts[i] // PAGE_SIZE), color, strong=True)
            else:
                _cell(s, cx + i * pitch, y, cw, "pad", None)
        _cell(s, cache_x, y, cw, str(len(slots)), color)
    note_y = rows_y[1] + CELL_H + 26
    firsts = [slot for _, slots, _ in REQS for slot in slots[::PAGE_SIZE]]
    sums = ",  ".join(f"{slot} // {PAGE_SIZE} = {slot // PAGE_SIZE}" for slot in firsts)
    s.text(560, note_y, sums, size=12.5, mono=True, muted=True)
    s.text(560, note_y + 18, "pad: past cache_seqlens, never read", size=12.5, muted=True)
    s.arrow(452, 148, 562, 148, width=1.8)
    s.text(507, 140, "every 4th slot", size=12.5, anchor="middle", muted=True)
    s.text(507, 165, "// page_size", size=12.5, anchor="middle", mono=True, muted=True)

    # ---- (b) FlashInfer: the rows end to end, pages of one slot
    by = 280
    s.arrow(180, rows_y[1] + CELL_H + 8, 180, by - 30, width=1.8)
    s.text(192, 226, "A's row, then B's row", size=12.5, muted=True)
    _header(
        s,
        20,
        by,
        '(b) FlashInfer, backend "fi"',
        "the pool as pages of one slot: every key's slot, the requests end to end",
    )
    bx, iy = 150, by + 40
    flat = [(slot, color) for _, slots, color in REQS for slot in slots]
    s.text(20, iy + 21, "indices", size=13, mono=True)
    for i, (slot, color) in enumerate(flat):
        _cell(s, bx + i * pitch, iy, cw, str(slot), color)
    # kv_indptr: ticks at the requests' boundaries, their spans between
    ty = iy + CELL_H + 8
    s.text(20, ty + 26, "kv_indptr", size=13, mono=True)
    offsets = [0]
    for _, slots, _ in REQS:
        offsets.append(offsets[-1] + len(slots))
    for off in offsets:
        x = bx + off * pitch - (pitch - cw) / 2
        s.line(x, ty - 4, x, ty + 8, color=None, width=1.6)
        s.text(x, ty + 26, str(off), size=13.5, anchor="middle", mono=True, bold=True)
    for (name, slots, color), start, end in zip(REQS, offsets, offsets[1:]):
        mid = bx + (start + end) / 2 * pitch - (pitch - cw) / 2
        s.text(
            mid, ty + 26, f"{name}'s {len(slots)} slots", size=12.5, anchor="middle", color=color
        )
    ly = ty + 48
    s.text(20, ly + 21, "last_page_len", size=13, mono=True)
    for i, (_, _, color) in enumerate(REQS):
        _cell(s, bx + i * pitch, ly, cw, "1", color)
    s.text(
        bx + len(REQS) * pitch + 8,
        ly + 21,
        "every page holds one token",
        size=12.5,
        muted=True,
    )
    s.lines(
        bx + len(flat) * pitch + 24,
        iy + 14,
        ["k_cache viewed as", "[slots, 1, kv_heads, head_dim]", "page_size = 1"],
        size=12.5,
        gap=1.45,
        mono=True,
        muted=True,
    )

    # ---- the key
    ky = 478
    x = 20.0
    for name, _, color in REQS:
        s.box(x, ky - 12, 16, 16, color, rx=3, fill_opacity=0.3, stroke_width=1.1)
        label = f"request {name}"
        s.text(x + 22, ky, label, size=12.5)
        x += 22 + text_width(label, 12.5) + 26
    s.box(x, ky - 12, 16, 16, GREY, rx=3, fill_opacity=0.3, stroke_width=2.6)
    label = "bold: a page's first slot, what FlashAttention reads"
    s.text(x + 22, ky, label, size=12.5)
    x += 22 + text_width(label, 12.5) + 26
    s.box(x, ky - 12, 16, 16, None, rx=3, dashed=True, stroke_width=1)
    s.text(x + 22, ky, "padding", size=12.5)
    return s.render()


# --------------------------------------------------------------------------- plan and run


def _step(
    s: Svg, x: float, y: float, w: float, h: float, title: str, lines: Sequence[str], color: str
) -> None:
    """A box on the timeline: a mono title and a few lines under it."""
    s.box(x, y, w, h, color, rx=8, fill_opacity=0.2)
    s.text(x + w / 2, y + 22, title, size=13.5, anchor="middle", bold=True, mono=True)
    s.lines(x + w / 2, y + 42, lines, size=12, anchor="middle", gap=1.3)


def fig_plan_run() -> str:
    s = Svg(
        "ch17-plan-run",
        940,
        460,
        "FlashInfer plans once per batch and runs once per layer",
        "A timeline of one batch through a model of L layers, left to right. Above, FlashInfer: "
        "prepare_metadata runs on the host and builds indptr and indices, but does not plan. "
        "At layer 0's attention, plan is called once: it copies the indices to the GPU and "
        "chooses how to split the keys among thread blocks; then run computes layer 0's "
        "attention. Layers 1 to L-1 call only run, which reuses the plan: only q and that "
        "layer's K/V cache change. Below, the torch backend of chapter 05: prepare_metadata "
        "builds the padding and the mask once, and then every layer gathers its keys and values "
        "into a padded rectangle before a masked attention.",
    )
    s.text(20, 28, "One batch, L layers: plan once, run per layer", size=15, bold=True)
    h = 84
    # the columns: prepare_metadata, plan, layer 0, layer 1, the others, layer L-1
    prep_x, prep_w = 20, 170
    plan_x, plan_w = 230, 190
    l0_x, run_w = 434, 120
    l1_x, more_x, more_w, last_x = 592, 738, 32, 796
    arrow_gap = 4

    def chain(y: float, stops: Sequence[tuple[float, float]]) -> None:
        """Arrows from each box's right edge to the next box's left edge."""
        for (x1, w1), (x2, _) in zip(stops, stops[1:]):
            s.arrow(x1 + w1 + arrow_gap, y, x2 - arrow_gap, y, width=1.5)

    def more(y: float) -> None:
        s.text(more_x + more_w / 2, y + h / 2 + 6, "⋯", size=18, anchor="middle", bold=True)

    # ---- FlashInfer
    fy = 94
    s.text(20, fy - 34, 'FlashInfer (backend "fi")', size=14.5, bold=True, color=PURPLE)
    _step(
        s,
        prep_x,
        fy,
        prep_w,
        h,
        "prepare_metadata",
        ["on the host: builds", "indptr, indices;", "no plan yet"],
        GREY,
    )
    # layer 0's attention: plan, then run, in one dashed frame
    s.box(
        plan_x - 10,
        fy - 12,
        l0_x + run_w + 10 - plan_x + 10,
        h + 24,
        None,
        rx=12,
        dashed=True,
        stroke_width=1.1,
    )
    s.label_bg(
        plan_x + 8, fy - 7, "layer 0's attention", size=12.5, anchor="start", bold=True, muted=True
    )
    _step(
        s,
        plan_x,
        fy,
        plan_w,
        h,
        "plan(...)",
        ["once per batch: indices to", "the GPU, keys split among", "the thread blocks"],
        ORANGE,
    )
    for x, layer in ((l0_x, "0"), (l1_x, "1"), (last_x, "L−1")):
        _step(s, x, fy, run_w, h, "run", [f"layer {layer}", f"q, K/V of layer {layer}"], PURPLE)
    more(fy)
    mid = fy + h / 2
    chain(
        mid,
        [
            (prep_x, prep_w),
            (plan_x, plan_w),
            (l0_x, run_w),
            (l1_x, run_w),
            (more_x, more_w),
            (last_x, run_w),
        ],
    )
    # the runs after the first reuse the plan
    bry = fy + h + 22
    s.path(
        f"M{l1_x},{bry - 6} L{l1_x},{bry} L{last_x + run_w},{bry} L{last_x + run_w},{bry - 6}",
        color=PURPLE,
        width=1.4,
        arrow_end=False,
    )
    s.lines(
        l1_x,
        bry + 20,
        ["layers 1 … L−1: the same plan;", "only q and that layer's K/V cache change"],
        size=12.5,
        gap=1.35,
        color=PURPLE,
    )

    # ---- torch (chapter 05)
    ty = 300
    s.text(20, ty - 34, "torch (chapter 05)", size=14.5, bold=True, color=GREY)
    _step(
        s,
        prep_x,
        ty,
        prep_w,
        h,
        "prepare_metadata",
        ["builds the padding", "and the mask,", "once per batch"],
        GREY,
    )
    for x, layer in ((l0_x, "0"), (l1_x, "1"), (last_x, "L−1")):
        _step(
            s,
            x,
            ty,
            run_w,
            h,
            f"layer {layer}",
            ["gathers K/V", "into a padded", "rectangle"],
            PURPLE,
        )
    more(ty)
    mid = ty + h / 2
    chain(mid, [(prep_x, prep_w), (l0_x, run_w), (l1_x, run_w), (more_x, more_w), (last_x, run_w)])
    s.label_bg(plan_x + plan_w / 2, mid + 4, "no plan", size=12.5, muted=True, italic=True)
    s.text(
        l0_x,
        ty + h + 28,
        "every layer: pool[kv_slots] → keys [bs, max_k], then a masked attention",
        size=12.5,
        muted=True,
    )

    # ---- the key
    ky = 440
    x = 20.0
    for color, label in (
        (GREY, "host work, once per batch"),
        (ORANGE, "plan: once per batch"),
        (PURPLE, "attention on the GPU, once per layer"),
    ):
        s.box(x, ky - 12, 16, 16, color, rx=3, fill_opacity=0.2, stroke_width=1.2)
        s.text(x + 22, ky, label, size=12.5)
        x += 22 + text_width(label, 12.5) + 26
    return s.render()
