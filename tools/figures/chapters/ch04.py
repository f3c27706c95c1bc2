"""Figures of chapter 04 (KV pool).

ch04-page-table  the main's three requests (5, 9 and 3 tokens) with page_size 4: their rows of
                 the page table, the pages they own, and the token slots of the pool
ch04-out-loc     the same three requests as batches: the prefill, then two decode steps; each
                 token's position and out_loc, the slot its K and V are written to
"""

from __future__ import annotations

from tools.figures.svg import BLUE, GREEN, ORANGE, TEAL, Svg

# examples/ch04_kvpool.py::show_layout with page_size=4 (its printed output has these numbers)
PAGE_SIZE = 4
REQS = [  # (label, tokens, pages, colour)
    ("request 0", 5, [0, 1], ORANGE),
    ("request 1", 9, [2, 3, 4], BLUE),
    ("request 2", 3, [5], TEAL),
]


def _slot(pages: list[int], position: int) -> int:
    return pages[position // PAGE_SIZE] * PAGE_SIZE + position % PAGE_SIZE


def fig_page_table() -> str:
    """Page-table rows on top, the pool's pages and slots below, two lookups drawn."""
    s = Svg(
        "ch04-page-table",
        800,
        470,
        "The page table and the KV pool",
        "Three requests of 5, 9 and 3 tokens with page_size 4. The page table has one row per "
        "request slot and one column per position; each cell holds the token slot where that "
        "position's keys and values live. Request 0 owns pages 0 and 1 and its row reads 0 to "
        "4; request 1 owns pages 2, 3 and 4 and its row reads 8 to 16; request 2 owns page 5 "
        "and its row reads 20 to 22. Below, the pool: six pages of four slots each, 24 slots, "
        "of which 17 hold tokens and 7 are unused. A slot's number is page times page_size plus "
        "the offset in the page.",
    )
    # ---- the page table
    tx, ty, cw, ch = 118, 64, 48, 30
    cols = 10
    s.text(16, 26, "page table", size=15, bold=True)
    s.text(
        112,
        26,
        "ctx.page_table[request slot, position] = token slot",
        size=13,
        muted=True,
        mono=True,
    )
    for c in range(cols):
        s.text(tx + c * cw + cw / 2, ty - 10, str(c), size=12, anchor="middle", muted=True)
    s.text(tx - 12, ty - 10, "position", size=12, anchor="end", muted=True)
    cell_pos: dict[tuple[int, int], tuple[float, float]] = {}
    for r, (label, n, pages, color) in enumerate(REQS):
        y = ty + r * (ch + 6)
        s.text(tx - 12, y + 20, label, size=13, anchor="end", bold=True)
        for c in range(cols):
            x = tx + c * cw
            if c < n:
                picked = (r, c) == (1, 4)
                s.box(
                    x + 2,
                    y,
                    cw - 4,
                    ch,
                    color,
                    rx=5,
                    fill_opacity=0.22,
                    stroke_width=2.4 if picked else 1.2,
                )
                s.text(
                    x + cw / 2, y + 20, str(_slot(pages, c)), size=13.5, anchor="middle", mono=True
                )
                cell_pos[(r, c)] = (x + cw / 2, y + ch)
            else:
                s.box(x + 2, y, cw - 4, ch, None, rx=5, dashed=True, stroke_width=0.8)
        s.text(tx + cols * cw + 16, y + 20, f"pages {pages}", size=13, mono=True, color=color)

    # ---- the pool
    py = 282
    pw_slot, gap = 30, 8
    px0 = 8
    s.text(16, py - 52, "KV pool, one layer's K", size=15, bold=True)
    shape_label = (222, py - 52, "k_cache(layer): [pages, page_size, kv_heads, head_dim]")
    owner: dict[int, tuple[int, str]] = {}
    for _, n, pages, color in REQS:
        for p in range(n):
            owner[_slot(pages, p)] = (p, color)
    slot_pos: dict[int, float] = {}
    num_pages = 6
    for page in range(num_pages):
        x0 = px0 + page * (PAGE_SIZE * pw_slot + gap) + 20
        s.box(x0 - 4, py - 24, PAGE_SIZE * pw_slot + 8, 74, None, rx=7, stroke_width=1)
        s.text(
            x0 + PAGE_SIZE * pw_slot / 2,
            py - 9,
            f"page {page}",
            size=12.5,
            anchor="middle",
            bold=True,
        )
        for off in range(PAGE_SIZE):
            slot = page * PAGE_SIZE + off
            x = x0 + off * pw_slot
            slot_pos[slot] = x + pw_slot / 2
            if slot in owner:
                pos, color = owner[slot]
                width = 2.4 if slot == 12 else 1
                s.box(x + 1, py, pw_slot - 2, 26, color, rx=4, fill_opacity=0.3, stroke_width=width)
                s.text(x + pw_slot / 2, py + 17.5, str(pos), size=12, anchor="middle")
            else:
                s.box(x + 1, py, pw_slot - 2, 26, None, rx=4, dashed=True, stroke_width=0.8)
            s.text(
                x + pw_slot / 2, py + 42, str(slot), size=11, anchor="middle", muted=True, mono=True
            )
    s.text(px0 + 4, py + 17.5, "pos", size=11, anchor="middle", muted=True)
    s.text(px0 + 4, py + 42, "slot", size=11, anchor="middle", muted=True)

    # one lookup: request 1, position 4
    for r, c in ((1, 4),):
        x1, y1 = cell_pos[(r, c)]
        slot = _slot(REQS[r][2], c)
        color = REQS[r][3]
        s.path(
            f"M{x1},{y1 + 2} C{x1},{y1 + 60} {slot_pos[slot]},{py - 90} {slot_pos[slot]},{py - 2}",
            color=color,
            width=1.6,
        )
    s.label_bg(*shape_label, size=13, anchor="start", muted=True, mono=True)
    # the legend and the numbers
    ly = py + 78
    s.lines(
        16,
        ly,
        [
            "slot = page × page_size + offset: request 1's position 4 is in its second page (3), "
            "offset 0 → slot 12.",
            "17 of the 24 slots hold tokens; 7 are reserved but unused (the end of each request's "
            "last page).",
            "The pool is one tensor, [2, layers, pages, page_size, kv_heads, head_dim]; K is "
            "index 0, V index 1.",
        ],
        size=13,
        muted=True,
        gap=1.5,
    )
    s.box(16, ly + 52, 22, 16, None, rx=3, dashed=True, stroke_width=0.8)
    s.text(46, ly + 65, "unused slot", size=12.5, muted=True)
    s.box(140, ly + 52, 22, 16, BLUE, rx=3, fill_opacity=0.3, stroke_width=1)
    s.text(
        170,
        ly + 65,
        "a slot in use, coloured by request; the number is the token's position",
        size=12.5,
        muted=True,
    )
    return s.render()


def fig_out_loc() -> str:
    """Three batches of the same requests: each token's position and out_loc."""
    x0, cw, rh = 118, 38, 28
    s = Svg(
        "ch04-out-loc",
        800,
        384,
        "A batch's positions and out_loc",
        "The same three requests as batches. The prefill batch holds all 17 prompt tokens in a "
        "row: positions 0 to 4, 0 to 8 and 0 to 2, and out_loc, the slots their keys and values "
        "are written to, 0 to 4, 8 to 16 and 20 to 22. Decode step 1 holds one token per "
        "request, at positions 5, 9 and 3, written to slots 5, 17 and 23. In decode step 2, "
        "positions 6, 10 and 4: request 2's token at position 4 needs a second page, the "
        "allocator hands it page 6, and the token goes to slot 24.",
    )

    def labels(y: float) -> None:
        for ri, (label, bold) in enumerate(
            (("request", True), ("positions", False), ("out_loc", False))
        ):
            s.text(
                x0 - 12,
                y + ri * (rh + 4) + 19,
                label,
                size=13,
                anchor="end",
                bold=bold,
                mono=not bold,
            )

    def block(
        bx: float, y: float, positions: list[list[int]], pages: list[list[int]], mark: int | None
    ) -> None:
        col = 0
        for r, (name, _, _, color) in enumerate(REQS):
            ps = positions[r]
            x = bx + col * cw
            s.box(
                x + 1,
                y + 4,
                len(ps) * cw - 2,
                rh - 8,
                color,
                rx=4,
                fill_opacity=0.35,
                stroke_width=1,
            )
            s.text(
                x + len(ps) * cw / 2,
                y + 18,
                name if len(ps) > 2 else str(r),
                size=12,
                anchor="middle",
            )
            for j, p in enumerate(ps):
                xx = bx + (col + j) * cw
                for ri, value in ((1, p), (2, _slot(pages[r], p))):
                    yy = y + ri * (rh + 4)
                    strong = ri == 2 and r == mark
                    s.box(
                        xx + 2,
                        yy,
                        cw - 4,
                        rh,
                        color,
                        rx=5,
                        fill_opacity=0.12 if ri == 1 else 0.28,
                        stroke_width=2.4 if strong else 1.1,
                    )
                    s.text(xx + cw / 2, yy + 19, str(value), size=13, anchor="middle", mono=True)
            col += len(ps)

    pages = [list(p) for _, _, p, _ in REQS]
    # the prefill
    y = 20
    s.text(16, y + 14, "prefill", size=15, bold=True, color=ORANGE)
    s.text(90, y + 14, "every prompt token, 5 + 9 + 3 = 17 rows", size=13, muted=True)
    y += 26
    labels(y)
    block(x0, y, [list(range(n)) for _, n, _, _ in REQS], pages, None)
    # two decode steps, side by side
    y += 3 * (rh + 4) + 34
    s.text(16, y + 14, "decode step 1", size=15, bold=True, color=GREEN)
    bx2 = x0 + 300
    s.text(bx2, y + 14, "decode step 2", size=15, bold=True, color=GREEN)
    y += 26
    labels(y)
    block(x0, y, [[5], [9], [3]], pages, None)
    s.lines(
        x0 + 3 * cw + 14,
        y + 19 + rh + 4,
        ["no new page:", "each has room"],
        size=12.5,
        muted=True,
        gap=1.3,
    )
    pages2 = [pages[0], pages[1], pages[2] + [6]]
    block(bx2, y, [[6], [10], [4]], pages2, 2)
    s.lines(
        bx2 + 3 * cw + 14,
        y + 19 + rh + 4,
        ["request 2's position 4 starts a", "new page: it gets page 6, slot 24"],
        size=12.5,
        muted=True,
        gap=1.3,
    )
    y += 3 * (rh + 4) + 30
    s.lines(
        16,
        y,
        [
            "input_ids, positions and out_loc have one entry per token of the batch, requests "
            "side by side.",
            "Each layer writes its new k and v rows to the slots in out_loc, then reads every key "
            "of a request",
            "back through page_table[table_idx, :device_len]: in decode step 1, request 0 reads "
            "slots 0 to 5.",
        ],
        size=13,
        muted=True,
        gap=1.45,
    )
    return s.render()
