"""Figures of chapter 14 (scheduler IO).

ch14-one-turn  one turn of the scheduler's loop on two tensor-parallel ranks: rank 0 takes the
               tokenizer's messages, forwards their bytes over XPUB and broadcasts how many over
               the CPU process group, so that rank 1 reads the same messages at the same turn
"""

from __future__ import annotations

from tools.figures.svg import GREEN, GREY, ORANGE, PURPLE, Svg, text_width


def fig_one_turn() -> str:
    s = Svg(
        "ch14-one-turn",
        940,
        424,
        "One turn of the scheduler's loop on two ranks",
        "Three timelines on one time axis: the tokenizer, scheduler rank 0 and scheduler rank 1. "
        "Both ranks are idle, so both block: rank 0 on its PULL socket, rank 1 on its SUB "
        "socket. The tokenizer pushes message A; rank 0's PULL gets it and rank 0 forwards A's "
        "raw bytes with put_raw over XPUB, which rank 1's SUB gets. Meanwhile the tokenizer has "
        "pushed B and C; rank 0 takes every message already there without waiting, dropping any "
        "that cannot be decoded. Rank 0 then broadcasts the count, 2, over the CPU process group, "
        "while rank 1 waits in the same broadcast; rank 0 forwards B and C, and rank 1 reads "
        "exactly two messages from SUB. Both ranks now hold A, B and C for this turn and "
        "schedule the same batch.",
    )
    lane_x, lane_r = 150, 920
    tok_y, r0_y, r1_y = 72, 150, 250  # the lanes' centre lines
    axis_y = 290
    eh = 26  # an event box's height

    def event(x: float, y: float, label: str, color: str, fill: float = 0.25) -> float:
        """A call on a lane, ``x`` its left edge; returns its right edge."""
        w = text_width(label, 12, mono=True) + 16
        s.box(x, y - eh / 2, w, eh, color, rx=5, fill_opacity=fill, stroke_width=1.2)
        s.text(x + w / 2, y + 4.5, label, size=12, anchor="middle", mono=True)
        return x + w

    def blocks(x1: float, x2: float, y: float, label: str) -> None:
        """A blocking wait on a lane, from ``x1`` to ``x2``."""
        s.box(x1, y - 11, x2 - x1, 22, GREY, rx=4, dashed=True, fill_opacity=0.12, stroke_width=1.1)
        s.text((x1 + x2) / 2, y + 4.5, label, size=12, anchor="middle", muted=True)

    def message(x1: float, y1: float, x2: float, y2: float, label: str) -> None:
        """A message's bytes over ZMQ, labelled with its name."""
        s.arrow(x1, y1, x2, y2, width=1.6)
        s.label_bg(x1 + (x2 - x1) * 0.45 + 9, y1 + (y2 - y1) * 0.45 + 4, label, size=12, bold=True)

    # ---- title and lanes
    title = "One turn of the loop on two ranks"
    s.text(8, 28, title, size=15, bold=True)
    s.text(
        8 + 1.2 * text_width(title, 15, bold=True) + 18,
        28,
        "both must see the same messages at the same turn",
        size=13,
        muted=True,
    )
    for y, name, role, color in (
        (tok_y, "tokenizer", "PUSH out", GREY),
        (r0_y, "scheduler rank 0", "PULL in, XPUB out", ORANGE),
        (r1_y, "scheduler rank 1", "SUB in", ORANGE),
    ):
        s.text(8, y - 2, name, size=13.5, bold=True)
        s.text(8, y + 14, role, size=11.5, muted=True)
        s.line(lane_x, y, lane_r, y, color=color, opacity=0.45, width=1.2)

    # ---- 1: idle, so both ranks block
    a_at = 262  # where A reaches rank 0
    blocks(lane_x + 2, a_at, r0_y, "waits on PULL")
    get_a = 352  # where A reaches rank 1
    blocks(lane_x + 2, get_a - 4, r1_y, "waits on SUB")

    # ---- 2: A arrives and is forwarded
    put_a = 166
    put_a_r = event(put_a, tok_y, "put(A)", GREY)
    message((put_a + put_a_r) / 2, tok_y + eh / 2, a_at, r0_y - 11, "A")
    fwd_a = a_at + 4
    fwd_a_r = event(fwd_a, r0_y, "put_raw(A)", ORANGE)
    get_a_r = event(get_a, r1_y, "get(): A", ORANGE, fill=0.12)
    message((fwd_a + fwd_a_r) / 2, r0_y + eh / 2, (get_a + get_a_r) / 2, r1_y - eh / 2, "A")

    # ---- 3: B and C are already there: rank 0 takes them without waiting
    take = 432
    take_r = event(take, r0_y, "take B, C", ORANGE)
    tc = (take + take_r) / 2
    x = 296.0
    for name, dx in (("B", -20), ("C", 20)):
        right = event(x, tok_y, f"put({name})", GREY)
        message((x + right) / 2, tok_y + eh / 2, tc + dx, r0_y - eh / 2, name)
        x = right + 6
    s.lines(
        tc,
        r0_y + 31,
        ["undecodable ones are", "dropped, not forwarded"],
        size=11.5,
        anchor="middle",
        muted=True,
        gap=1.3,
    )

    # ---- 4: the count, over the CPU process group; rank 1 waits in the same broadcast
    bc = 622  # the broadcast's centre
    bc0, bc1 = "broadcast(2)", "broadcast(): 2"
    bc1_x = bc - (text_width(bc1, 12, mono=True) + 16) / 2
    blocks(get_a_r + 4, bc1_x - 4, r1_y, "waits for count")
    bc0_r = event(bc - (text_width(bc0, 12, mono=True) + 16) / 2, r0_y, bc0, ORANGE)
    bc1_r = event(bc1_x, r1_y, bc1, ORANGE, fill=0.12)
    s.arrow(bc, r0_y + eh / 2, bc, r1_y - eh / 2, color=PURPLE, dashed=True, width=1.8)
    s.label_bg(bc, r0_y + 52, "broadcast count = 2", size=12, bold=True, color=PURPLE)
    s.label_bg(bc, r0_y + 68, "(CPU group)", size=12, color=PURPLE)

    # ---- 5: rank 0 forwards B and C; rank 1 reads exactly 2
    fwd_bc = max(bc0_r, bc1_r) + 8
    fwd_bc_r = event(fwd_bc, r0_y, "put_raw ×2", ORANGE)
    get_bc = fwd_bc + 26
    get_bc_r = event(get_bc, r1_y, "get() ×2", ORANGE, fill=0.12)
    for name, f in (("B", 0.25), ("C", 0.75)):
        message(
            fwd_bc + (fwd_bc_r - fwd_bc) * f,
            r0_y + eh / 2,
            get_bc + (get_bc_r - get_bc) * f,
            r1_y - eh / 2,
            name,
        )

    # ---- 6: the same messages on both ranks: the same batch
    turn_w = 1.2 * text_width("turn's messages:", 11.5) + 12
    turn_x = lane_r - turn_w
    for y in (r0_y, r1_y):
        s.box(turn_x, y - 20, turn_w, 40, GREEN, rx=6, fill_opacity=0.22, stroke_width=1.2)
        s.text(
            turn_x + turn_w / 2, y - 4, "turn's messages:", size=11.5, anchor="middle", muted=True
        )
        s.text(turn_x + turn_w / 2, y + 13, "A, B, C", size=13, anchor="middle", bold=True)
    s.lines(
        turn_x + turn_w / 2,
        (r0_y + r1_y) / 2 - 3,
        ["both schedule", "the same batch"],
        size=12,
        anchor="middle",
        muted=True,
        gap=1.3,
    )

    # ---- the time axis, with the steps' numbers
    s.arrow(lane_x, axis_y, lane_r, axis_y, width=1.4)
    s.text(lane_r, axis_y + 18, "time", size=12.5, anchor="end", muted=True)
    steps = (
        ((lane_x + a_at) / 2, "idle: rank 0 blocks on PULL, rank 1 on SUB"),
        ((fwd_a + fwd_a_r) / 2, "A comes; rank 0 forwards its raw bytes"),
        (tc, "B and C are already there: taken, no wait"),
        (bc, "rank 0 broadcasts the count (CPU group, gloo)"),
        ((fwd_bc + get_bc_r) / 2, "rank 0 forwards B, C; rank 1 reads exactly 2"),
        (turn_x + turn_w / 2, "both hold A, B, C: the same batch"),
    )
    for i, (sx, caption) in enumerate(steps):
        s.pill(sx, axis_y + 16, str(i + 1), GREY, size=11, anchor="middle")
        kx, ky = (8, 470)[i // 3], axis_y + 48 + 22 * (i % 3)
        s.pill(kx, ky - 4, str(i + 1), GREY, size=11)
        s.text(kx + 28, ky, caption, size=12.5)

    s.text(
        8,
        axis_y + 120,
        "Solid: a message's bytes over ZMQ. Dashed purple: torch.distributed.broadcast over "
        "the CPU process group. Dashed grey: a blocking wait.",
        size=12.5,
        muted=True,
    )
    return s.render()
