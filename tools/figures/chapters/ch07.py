"""Figures of chapter 07 (scheduler skeleton).

ch07-loop        one turn of Scheduler.normal_loop, and where a request lives on its way through
ch07-timeline    the main's five requests, steps 0-11: which batch each step runs
ch07-token-pool  one decode step of the main on the device: inputs read from the token pool,
                 out_loc read from the page table, sampled tokens written back
"""

from __future__ import annotations

from collections.abc import Callable

from tools.figures.svg import CYAN, GREEN, GREY, ORANGE, PURPLE, RED, TEAL, Svg


def fig_loop() -> str:
    s = Svg(
        "ch07-loop",
        940,
        560,
        "One turn of the scheduler's loop",
        "Left: the five parts of Scheduler.normal_loop, run once per step. receive_msg hands over "
        "the messages that arrived; _schedule_next_batch builds a prefill batch of waiting "
        "requests "
        "if any can be admitted, else a decode batch of every running request; _prepare_batch "
        "allocates pages and builds positions, the input tuple, the write tuple, out_loc, the "
        "attention metadata and the sampling arguments; _forward reads the input ids from the "
        "token pool, runs the engine and writes the sampled tokens back into the token pool; "
        "_process_last_data appends each token on the host, replies with a DetokenizeMsg and frees "
        "what finished requests held. Right: a request's way through the scheduler, from a UserMsg "
        "to a PendingReq in the waiting list, to a Req with a request slot and pages in a prefill "
        "batch, to the running requests of the decode batches, and out when it finishes.",
    )
    s.text(20, 28, "Scheduler.normal_loop: one step", size=16, bold=True)
    steps = [
        (
            "receive_msg(blocking)",
            [
                "UserMsg -> waiting list; AbortBackendMsg -> drop",
                "blocks only when nothing is runnable",
            ],
            TEAL,
        ),
        (
            "_schedule_next_batch()",
            [
                "prefill first: PrefillManager.schedule_next_batch",
                "or else: DecodeManager.schedule_next_batch",
            ],
            ORANGE,
        ),
        (
            "_prepare_batch(batch)",
            [
                "allocate_paged, positions, input tuple, write tuple,",
                "out_loc, attention metadata, sampling arguments",
            ],
            ORANGE,
        ),
        (
            "_forward(forward_input)",
            [
                "input_ids = token_pool[input tuple]; forward_batch;",
                "token_pool[write tuple] = tokens; filter_reqs",
            ],
            PURPLE,
        ),
        (
            "_process_last_data(data)",
            [
                "append each token on the host; DetokenizeMsg;",
                "finished: free its request slot and pages",
            ],
            GREEN,
        ),
    ]
    x, w, h, gap = 100, 400, 74, 22
    y = 48
    tops = []
    for i, (title, rows, color) in enumerate(steps):
        s.box(x, y, w, h, color, rx=8)
        s.text(x + 14, y + 24, title, size=14, bold=True, mono=True)
        s.lines(x + 14, y + 45, rows, size=12.5, muted=True, gap=1.35)
        tops.append(y)
        if i < len(steps) - 1:
            s.arrow(x + w / 2, y + h + 2, x + w / 2, y + h + gap - 2)
        y += h + gap
    # the loop back
    last_mid = tops[-1] + h / 2
    first_mid = tops[0] + h / 2
    s.path(f"M{x - 2},{last_mid} H{x - 44} V{first_mid} H{x - 4}", width=1.6)
    s.label_bg(x - 44, (first_mid + last_mid) / 2, "next step", size=12.5, muted=True)
    s.text(
        x,
        y + 8,
        "send_result(reply): one DetokenizeMsg per request of the batch",
        size=12.5,
        muted=True,
    )

    # a request's way through
    rx, rw = 540, 380
    s.text(rx, 28, "where a request lives", size=16, bold=True)
    places = [
        ("UserMsg(uid, input_ids, sampling_params)", "arrives through receive_msg", GREY),
        ("PendingReq in pending_list", "PrefillManager; waits in arrival order", TEAL),
        ("Req in a prefill batch", "a request slot (table_idx), pages for its prompt", ORANGE),
        ("Req in running_reqs", "DecodeManager; every decode batch holds all of them", GREEN),
        ("finished", "slot and pages back; DetokenizeMsg(finished=True)", GREY),
    ]
    y = 48
    ph = 62
    for i, (title, sub, color) in enumerate(places):
        s.box(rx, y, rw, ph, color, rx=8, dashed=(i in (0, 4)))
        s.text(rx + 14, y + 25, title, size=13, bold=True, mono=i < 4)
        s.text(rx + 14, y + 46, sub, size=12.5, muted=True)
        if i < len(places) - 1:
            s.arrow(rx + rw / 2, y + ph + 2, rx + rw / 2, y + ph + 22)
        y += ph + 24
    # side notes on the arrows
    ys = [48 + ph + 12, 48 + 2 * (ph + 24) - 12, 48 + 3 * (ph + 24) - 12, 48 + 4 * (ph + 24) - 12]
    notes = [
        "_process_one_msg",
        "PrefillAdder.try_add_one",
        "filter_reqs (after its prefill)",
        "can_decode is False, or EOS",
    ]
    for yy, note in zip(ys, notes, strict=True):
        s.text(rx + rw / 2 + 12, yy + 4, note, size=12, muted=True, italic=True)
    return s.render()


# The main's trace (examples/ch07_scheduler.py, show_continuous_batching; the page prints it):
# per request its arrival step and {step: kind}; P prefill, D decode, E the step of its last token.
TIMELINE = [
    ("r0", 0, {0: "P", 1: "D", 2: "D", 5: "D", 6: "D", 7: "E"}),
    ("r1", 0, {0: "P", 1: "D", 2: "E"}),
    ("r2", 3, {3: "P", 5: "D", 6: "D", 7: "D", 8: "E"}),
    ("r3", 4, {4: "P", 5: "D", 6: "D", 7: "E"}),
    ("r4", 9, {9: "P", 10: "D", 11: "E"}),
]
STEPS = 12


def fig_timeline() -> str:
    x0, y0, cw, ch = 80, 96, 70, 46
    width = x0 + STEPS * cw + 20
    s = Svg(
        "ch07-timeline",
        width,
        482,
        "Continuous batching: the main's five requests, step by step",
        "A grid of scheduler steps 0 to 11 against requests r0 to r4. r0 and r1 arrive at step 0 "
        "and are prefilled together; r2 arrives at step 3 and r3 at step 4, and each is prefilled "
        "alone at once while the running requests wait; from step 5 one decode batch holds r0, r2 "
        "and r3. r1 finishes at step 2, r0 and r3 at step 7, r2 at step 8. r4 arrives at step 9, "
        "when nothing else runs, and finishes at step 11. Each step runs either one prefill batch "
        "or one decode batch.",
    )
    s.text(20, 28, "which batch each step runs (the main's trace)", size=16, bold=True)
    kinds: dict[int, str] = {}
    sizes: dict[int, int] = {}
    for _, _, cells in TIMELINE:
        for k, v in cells.items():
            kinds[k] = "prefill" if v == "P" else "decode"
            sizes[k] = sizes.get(k, 0) + 1
    s.text(x0 - 12, y0 - 40, "step", size=13, anchor="end", muted=True)
    for k in range(STEPS):
        cx = x0 + (k + 0.5) * cw
        s.text(cx, y0 - 40, str(k), size=15, anchor="middle", bold=True)
        color = ORANGE if kinds[k] == "prefill" else GREEN
        s.box(x0 + k * cw + 4, y0 - 30, cw - 8, 20, color, rx=4, fill_opacity=0.35, stroke_width=1)
        s.text(cx, y0 - 15.5, f"{kinds[k]} {sizes[k]}", size=11.5, anchor="middle")
    for r, (name, arrive, cells) in enumerate(TIMELINE):
        top = y0 + 8 + r * ch
        s.text(20, top + ch / 2 + 3, name, size=15, bold=True)
        s.line(x0, top + ch - 3, x0 + STEPS * cw, top + ch - 3, color=None, opacity=0.12, width=1)
        s.line(
            x0 + arrive * cw + 2,
            top + 4,
            x0 + arrive * cw + 2,
            top + ch - 8,
            color=None,
            width=2.5,
            opacity=0.8,
        )
        for k, v in cells.items():
            cx = x0 + k * cw + 6
            color = ORANGE if v == "P" else GREEN
            s.box(
                cx, top + 5, cw - 12, ch - 14, color, rx=6, fill_opacity=0.5 if v == "E" else 0.28
            )
            label = {"P": "prefill", "D": "token", "E": "last ✓"}[v]
            s.text(cx + (cw - 12) / 2, top + ch / 2 + 2, label, size=12.5, anchor="middle")
        first, last = min(cells), max(cells)
        for k in range(first, last):
            if k not in cells:
                s.box(
                    x0 + k * cw + 6,
                    top + 5,
                    cw - 12,
                    ch - 14,
                    RED,
                    rx=6,
                    dashed=True,
                    fill_opacity=0.06,
                    stroke_width=1.2,
                )
                s.text(
                    x0 + (k + 0.5) * cw,
                    top + ch / 2 + 2,
                    "waits",
                    size=12,
                    anchor="middle",
                    color=RED,
                )
    gy = y0 + 8 + len(TIMELINE) * ch
    s.lines(
        x0,
        gy + 24,
        [
            "Steps 3 and 4 are the prefills of requests that just arrived: the running requests "
            "wait",
            "(r0 twice, r2 once). r4 arrives at step 9, when nothing else runs, and starts at "
            "once.",
        ],
        size=13,
        color=RED,
        gap=1.4,
    )
    ly = gy + 76
    s.box(x0, ly, 40, 22, ORANGE, rx=5, fill_opacity=0.28)
    s.text(x0 + 52, ly + 16, "prefill: the whole prompt, and the first token", size=13.5)
    s.box(x0 + 430, ly, 40, 22, GREEN, rx=5, fill_opacity=0.28)
    s.text(x0 + 482, ly + 16, "decode: one more token", size=13.5)
    s.line(x0 + 20, ly + 34, x0 + 20, ly + 56, color=None, width=2.5, opacity=0.8)
    s.text(x0 + 52, ly + 50, "the request arrives", size=13.5)
    s.text(x0 + 430, ly + 50, "header: the batch's phase and size", size=13.5, muted=True)
    return s.render()


# One decode step of the main (step 1): r0 in slot 15, r1 in slot 14, pages of one token.
POOL = {
    15: (["The", "capital", "of", "France", "is", "Paris"], [0, 1, 2, 3, 4, 8], 5, 6, "."),
    14: (["Water", "boils", "at", "␣"], [5, 6, 7, 9], 3, 4, "1"),
}


def fig_token_pool() -> str:
    s = Svg(
        "ch07-token-pool",
        940,
        540,
        "One decode step on the device: token pool and page table",
        "Step 1 of the main, a decode batch of r0 (request slot 15) and r1 (slot 14), with pages "
        "of "
        "one token. The token pool row of a slot holds the request's token ids by position: r0's "
        "prompt at positions 0 to 4 and the token Paris, written at position 5 by step 0; r1's "
        "prompt at 0 to 2 and a space at 3. The input tuple (slots 15 and 14, positions 5 and 3) "
        "reads the input ids from the token pool and out_loc, slots 8 and 9, from the same cells "
        "of the page table. The engine samples a period and the digit 1, and the write tuple "
        "(positions 6 and 4) stores them in the token pool, where step 2 reads them.",
    )
    cols, cw, rh = 8, 62, 34
    tx = 130
    ty = 72
    s.text(
        20,
        28,
        "decode step 1 of the main: r0 in request slot 15, r1 in slot 14",
        size=16,
        bold=True,
    )

    def grid(
        top: float, title: str, sub: str, cell: Callable[[int, int, float, float], None]
    ) -> None:
        s.text(20, top - 22, title, size=14.5, bold=True, mono=True)
        s.text(20 + 8.8 * len(title) + 14, top - 22, sub, size=12.5, muted=True)
        for c in range(cols):
            s.text(
                tx + c * cw + (cw - 4) / 2, top - 6, str(c), size=11.5, anchor="middle", muted=True
            )
        s.text(tx - 12, top - 6, "position", size=11.5, anchor="end", muted=True)
        for i, slot in enumerate((14, 15)):
            y = top + i * (rh + 6)
            s.text(tx - 12, y + rh / 2 + 5, f"slot {slot}", size=12.5, anchor="end", mono=True)
            for c in range(cols):
                cell(slot, c, tx + c * cw, y)
        s.text(tx - 12, top + 2 * (rh + 6) + 12, "(16 rows)", size=11.5, anchor="end", muted=True)

    def pool_cell(slot: int, c: int, x: float, y: float) -> None:
        words, _, read, write, sampled = POOL[slot]
        if c < len(words):
            color = ORANGE if c == read else (TEAL if c < len(words) else None)
            s.box(
                x,
                y,
                cw - 4,
                rh,
                color,
                rx=5,
                fill_opacity=0.4 if c == read else 0.16,
                stroke_width=2.2 if c == read else 1,
            )
            s.text(x + (cw - 4) / 2, y + rh / 2 + 5, words[c], size=12, anchor="middle", mono=True)
        elif c == write:
            s.box(x, y, cw - 4, rh, GREEN, rx=5, fill_opacity=0.4, stroke_width=2.2, dashed=True)
            s.text(
                x + (cw - 4) / 2,
                y + rh / 2 + 5,
                sampled,
                size=13,
                anchor="middle",
                mono=True,
                bold=True,
            )
        else:
            s.box(x, y, cw - 4, rh, None, rx=5, dashed=True, stroke_width=0.8)

    def table_cell(slot: int, c: int, x: float, y: float) -> None:
        _, kv_slots, read, _, _ = POOL[slot]
        if c < len(kv_slots):
            s.box(
                x,
                y,
                cw - 4,
                rh,
                CYAN if c == read else GREY,
                rx=5,
                fill_opacity=0.4 if c == read else 0.14,
                stroke_width=2.2 if c == read else 1,
            )
            s.text(
                x + (cw - 4) / 2,
                y + rh / 2 + 5,
                str(kv_slots[c]),
                size=12.5,
                anchor="middle",
                mono=True,
            )
        else:
            s.box(x, y, cw - 4, rh, None, rx=5, dashed=True, stroke_width=0.8)

    grid(ty, "token_pool", "token ids, by request slot and position (TableManager)", pool_cell)
    py = ty + 150
    grid(
        py,
        "page_table",
        "KV slots, the same shape (the engine's; CacheManager fills it)",
        table_cell,
    )

    # right-hand side: the step
    bx = 680
    s.box(bx, 52, 240, 118, ORANGE, rx=8)
    s.lines(
        bx + 12,
        74,
        ["input tuple", "slots     [15, 14]", "positions [ 5,  3]"],
        size=13,
        mono=True,
        gap=1.45,
    )
    s.text(bx + 12, 146, "input_ids = token_pool[...]", size=12.5, mono=True)
    s.text(bx + 12, 162, "  = [Paris, ␣]", size=12.5, mono=True, muted=True)
    s.box(bx, py - 20, 240, 70, CYAN, rx=8)
    s.text(bx + 12, py + 2, "out_loc = page_table[...]", size=12.5, mono=True)
    s.text(bx + 12, py + 22, "  = [8, 9]", size=12.5, mono=True, muted=True)
    s.text(bx + 12, py + 40, "where this step's K/V go", size=12, muted=True)

    ey = 392
    s.box(130, ey, 330, 56, PURPLE, rx=8)
    s.text(145, ey + 23, "engine.forward_batch(batch, args)", size=13, mono=True, bold=True)
    s.text(145, ey + 43, "positions [5, 3]; sampled: [., 1]", size=12.5, mono=True, muted=True)
    s.box(520, ey, 400, 56, GREEN, rx=8)
    s.text(535, ey + 23, "write tuple: slots [15, 14], positions [6, 4]", size=12.5, mono=True)
    s.text(535, ey + 43, "token_pool[...] = next_tokens_gpu", size=12.5, mono=True, muted=True)
    s.arrow(462, ey + 28, 518, ey + 28)
    s.arrow(bx + 120, 172, bx + 120, py - 22)
    s.path(f"M{bx + 120},{py + 52} V{ey - 20} H295 V{ey - 2}", width=1.6)
    # write back into the pool (dashed, green)
    s.path(
        f"M650,{ey - 2} V{ty + rh + 3} H{tx + cols * cw + 2}", color=GREEN, dashed=True, width=1.6
    )
    s.lines(
        20,
        490,
        [
            "The sampled tokens go to the host too (for the replies), but the next step's inputs "
            "come "
            "from the",
            "token pool: step 2 reads (15, 6) and (14, 4), on the device. A request that cannot "
            "decode any more",
            "writes to position -1 instead: the row's last column, always written again before it "
            "is "
            "read.",
        ],
        size=12.5,
        muted=True,
        gap=1.4,
    )
    return s.render()
