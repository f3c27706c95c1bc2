"""Figures of chapter 16 (tensor parallelism).

ch16-column-row      the core idea on two ranks, as matrices: W1 split by its rows (the output
                     features, a column split of y = x @ W1.T) needs no communication, W2 split by
                     its columns (the input features, a row split) gives partial sums of the whole
                     output, and one all-reduce adds them up on both ranks
ch16-layer-on-ranks  one decoder layer and the ends of the model on two ranks, as two lanes that
                     meet only at the collectives: an all-reduce after the embedding, after o_proj
                     and after down_proj, an all-gather after the LM head
"""

from __future__ import annotations

from collections.abc import Sequence

from tools.figures.svg import BLUE, GREY, ORANGE, PURPLE, Svg, text_width

RANK_COLORS = (BLUE, ORANGE)  # rank 0, rank 1, in both figures
COLLECTIVE = PURPLE  # all-reduce and all-gather: the only places the ranks meet


def _pill_label(s: Svg, x: float, y: float, rank: int) -> None:
    """The lane's name, ``y`` its vertical centre."""
    s.pill(x, y, f"rank {rank}", RANK_COLORS[rank], size=12.5)


# --------------------------------------------------------------------------- column and row


def fig_column_row() -> str:
    s = Svg(
        "ch16-column-row",
        940,
        520,
        "A column split then a row split on two ranks",
        "Two lanes, rank 0 above and rank 1 below, compute z = (x @ W1.T) @ W2.T. The input x, "
        "tokens by hidden, is whole on both ranks. W1, of shape [F, H], is split by its rows, "
        "the output features: rank 0 holds the top half and computes the first half of the "
        "columns of y = x @ W1.T, rank 1 the other half; no communication is needed. W2, of "
        "shape [H, F], is split by its columns, the input features that match each rank's half "
        "of y: rank r computes z_r = y_r @ W2_r.T, a partial sum with the whole output's shape. "
        "An all-reduce adds z0 + z1, and both ranks end with the whole z.",
    )
    c = 16  # a matrix cell
    tok, hid, feat = 3, 4, 8  # T, H, F
    lanes = (164, 356)  # the lanes' centre lines

    def cells(x: float, y: float, rows: int, cols: int, color: str | None) -> None:
        """A block of a matrix: filled cells, or dashed empty ones (held by the other rank)."""
        if color is None:
            s.box(x + 1, y + 1, cols * c - 2, rows * c - 2, None, rx=3, stroke_width=1, dashed=True)
            return
        for i in range(rows):
            for j in range(cols):
                cx, cy = x + j * c, y + i * c
                s.box(cx + 1, cy + 1, c - 2, c - 2, color, rx=2, fill_opacity=0.35, stroke_width=1)

    def op(x: float, y: float, sym: str) -> None:
        s.text(x, y + 6, sym, size=18, anchor="middle", bold=True, muted=True)

    # the columns' x: the matrices and the operators between them
    xx, w1x, yx, w2x, zrx, arx, zx = 100, 200, 304, 488, 676, 790, 854
    # ---- the title, and brackets over the two splits and the all-reduce
    s.text(
        8,
        26,
        "Two linear layers on two ranks: a column split, then a row split",
        size=15,
        bold=True,
    )

    def bracket(x1: float, x2: float, label: str, color: str | None) -> None:
        y = 62
        s.path(
            f"M{x1},{y + 6} L{x1},{y} L{x2},{y} L{x2},{y + 6}",
            color=color,
            width=1.4,
            arrow_end=False,
        )
        s.text((x1 + x2) / 2, y - 8, label, size=13.5, anchor="middle", bold=True, color=color)

    bracket(xx, yx + feat * c, "column split (no communication)", None)
    bracket(w2x, zrx + hid * c, "row split (partial sums)", None)
    ar_mid = (arx - 14 + zx + hid * c) / 2
    s.path(
        f"M{arx - 14},68 L{arx - 14},62 L{zx + hid * c},62 L{zx + hid * c},68",
        color=COLLECTIVE,
        width=1.4,
        arrow_end=False,
    )
    s.text(ar_mid, 38, "all-reduce:", size=13.5, anchor="middle", bold=True, color=COLLECTIVE)
    s.text(
        ar_mid,
        54,
        "z = z0 + z1 on both ranks",
        size=13.5,
        anchor="middle",
        bold=True,
        color=COLLECTIVE,
    )
    # the column heads: names and shapes
    hy = 90
    for x, w, name in (
        (xx, hid, "x [T, H]"),
        (w1x, hid, "W1 [F, H]"),
        (yx, feat, "y = x @ W1.T [T, F]"),
        (w2x, feat, "W2 [H, F]"),
        (zrx, hid, "z_r = y_r @ W2_r.T"),
        (zx, hid, "z [T, H]"),
    ):
        s.text(x + w * c / 2, hy, name, size=12.5, anchor="middle", mono=True)

    half = feat // 2
    for r, cy in enumerate(lanes):
        color = RANK_COLORS[r]
        _pill_label(s, 8, cy, r)
        # x, whole on both ranks
        top = cy - tok * c / 2
        cells(xx, top, tok, hid, GREY)
        s.text(xx + hid * c / 2, top + tok * c + 16, "whole", size=12, anchor="middle", muted=True)
        op((xx + hid * c + w1x) / 2, cy, "@")
        # W1: this rank's rows, the other rank's rows dashed
        w1top = cy - feat * c / 2
        for k in range(2):
            cells(w1x, w1top + k * half * c, half, hid, color if k == r else None)
        s.text(w1x + hid * c + 6, w1top + (r + 0.5) * half * c + 4, ".T", size=12.5, mono=True)
        rows = f"rows {r * half}-{r * half + half - 1}"
        s.text(
            w1x + hid * c / 2, w1top + feat * c + 16, rows, size=12, anchor="middle", color=color
        )
        op((w1x + hid * c + yx) / 2 + 8, cy, "=")
        # y: this rank's half of the columns
        for k in range(2):
            cells(yx + k * half * c, top, tok, half, color if k == r else None)
        s.text(
            yx + feat * c / 2,
            top + tok * c + 16,
            f"y{r}: features {r * half}-{r * half + half - 1}",
            size=12,
            anchor="middle",
            color=color,
        )
        op((yx + feat * c + w2x) / 2, cy, "@")
        # W2: the columns that match this rank's half of y
        w2top = cy - hid * c / 2
        for k in range(2):
            cells(w2x + k * half * c, w2top, hid, half, color if k == r else None)
        s.text(w2x + feat * c + 4, w2top + 12, ".T", size=12.5, mono=True)
        s.text(
            w2x + feat * c / 2,
            w2top + hid * c + 16,
            f"columns {r * half}-{r * half + half - 1}",
            size=12,
            anchor="middle",
            color=color,
        )
        op((w2x + feat * c + zrx) / 2 + 6, cy, "=")
        # z_r: a partial sum of the whole output's shape
        cells(zrx, top, tok, hid, color)
        s.text(
            zrx + hid * c / 2,
            top + tok * c + 16,
            f"z{r}: partial [T, H]",
            size=12,
            anchor="middle",
            color=color,
        )
        # the all-reduce node, then the whole z
        s.arrow(zrx + hid * c + 4, cy, arx - 14, cy, color=COLLECTIVE, width=1.6)
        s.box(arx - 13, cy - 13, 26, 26, COLLECTIVE, rx=13, fill_opacity=0.25, solid_bg=True)
        s.text(arx, cy + 6, "+", size=17, anchor="middle", bold=True, color=COLLECTIVE)
        s.arrow(arx + 14, cy, zx - 4, cy, color=COLLECTIVE, width=1.6)
        cells(zx, top, tok, hid, GREY)
        s.text(zx + hid * c / 2, top + tok * c + 16, "z0 + z1", size=12, anchor="middle", mono=True)
    # the all-reduce joins the lanes: each rank sends its partial sum, gets the total
    s.path(
        f"M{arx},{lanes[0] + 14} L{arx},{lanes[1] - 14}",
        color=COLLECTIVE,
        width=2,
        arrow_start=True,
    )
    s.label_bg(
        arx, (lanes[0] + lanes[1]) / 2 + 4, "all-reduce", size=12.5, bold=True, color=COLLECTIVE
    )

    # ---- the key
    ky = 470
    s.box(8, ky - 12, 14, 14, GREY, rx=2, fill_opacity=0.35, stroke_width=1)
    s.text(28, ky, "whole on both ranks", size=12.5)
    s.box(180, ky - 12, 14, 14, BLUE, rx=2, fill_opacity=0.35, stroke_width=1)
    s.box(198, ky - 12, 14, 14, ORANGE, rx=2, fill_opacity=0.35, stroke_width=1)
    s.text(218, ky, "held or computed by rank 0, rank 1", size=12.5)
    s.box(450, ky - 12, 14, 14, None, rx=2, stroke_width=0.8, dashed=True)
    s.text(470, ky, "on the other rank, not here", size=12.5)
    s.text(
        8,
        ky + 26,
        "y = x @ W.T with W of shape [out, in] (as in F.linear): the column split cuts W's "
        "rows, the row split cuts W's columns.",
        size=12.5,
        muted=True,
    )
    return s.render()


# --------------------------------------------------------------------------- layer on ranks

# A lane's step: ("op", title, mono, tag, rank 0's lines, rank 1's lines, split), split False for
# a module that both ranks hold whole; ("all-reduce",) and ("all-gather",), where the lanes meet;
# ("add",), the residual add; ("more",), the other layers.
Step = tuple


def _op(
    title: str, tag: str, r0: Sequence[str], r1: Sequence[str] | None = None, mono: bool = True
) -> Step:
    split = r1 is not None
    return ("op", title, mono, tag, tuple(r0), tuple(r1 if split else r0), split)


# Each band: the dashed frame's label, the first and last framed steps, the steps.
BANDS: list[tuple[str | None, int, int, list[Step]]] = [
    (
        "decoder layer: attention",
        2,
        7,
        [
            _op(
                "embed_tokens",
                "vocabulary split",
                ["rows 0 … V/2−1", "others give zeros"],
                ["rows V/2 … V−1", "others give zeros"],
            ),
            ("all-reduce",),
            _op("RMSNorm", "whole", ["the same on", "both ranks"], mono=False),
            _op(
                "qkv_proj",
                "column split",
                ["q heads 0-1", "kv head 0"],
                ["q heads 2-3", "kv head 1"],
            ),
            _op(
                "attention",
                "its heads only",
                ["q heads 0-1", "caches kv head 0"],
                ["q heads 2-3", "caches kv head 1"],
                mono=False,
            ),
            _op(
                "o_proj",
                "row split",
                ["in: heads 0-1", "out: partial"],
                ["in: heads 2-3", "out: partial"],
            ),
            ("all-reduce",),
            ("add",),
        ],
    ),
    (
        "decoder layer: MLP",
        0,
        5,
        [
            _op("RMSNorm", "whole", ["the same on", "both ranks"], mono=False),
            _op(
                "gate_up_proj",
                "column split",
                ["1st half of gate", "1st half of up"],
                ["2nd half of gate", "2nd half of up"],
            ),
            _op(
                "SiLU and multiply",
                "elementwise",
                ["on its half", "of the features"],
                ["on its half", "of the features"],
                mono=False,
            ),
            _op(
                "down_proj",
                "row split",
                ["in: its half", "out: partial"],
                ["in: its half", "out: partial"],
            ),
            ("all-reduce",),
            ("add",),
        ],
    ),
    (
        None,
        0,
        0,
        [
            ("more",),
            _op("RMSNorm", "whole", ["the final norm,", "same on both ranks"], mono=False),
            _op(
                "lm_head",
                "vocabulary split",
                ["logits of tokens", "0 … V/2−1"],
                ["logits of tokens", "V/2 … V−1"],
            ),
            ("all-gather",),
            _op("logits [T, V]", "whole", ["the whole vocabulary", "on both ranks"]),
        ],
    ),
]


def fig_layer_on_ranks() -> str:
    s = Svg(
        "ch16-layer-on-ranks",
        940,
        820,
        "One decoder layer and the ends of the model on two ranks",
        "Two lanes, rank 0 above and rank 1 below, run the same model left to right, in three "
        "rows. Each rank's embedding holds half of the vocabulary's rows and writes zeros for "
        "the tokens of the other half; an all-reduce adds the two, so both ranks hold every "
        "token's embedding. In the attention half of each decoder layer, RMSNorm is whole on "
        "both ranks; qkv_proj is split by columns, rank 0 computing query heads 0 and 1 and "
        "key/value head 0, rank 1 query heads 2 and 3 and key/value head 1; attention runs on "
        "each rank's own heads and caches its own key/value head; o_proj is split by rows and "
        "gives a partial sum, which an all-reduce adds up before the residual add. The MLP half "
        "is the same: RMSNorm whole, gate_up_proj split by columns, SiLU and multiply on each "
        "rank's half of the features, down_proj split by rows, an all-reduce, the residual add. "
        "After the other layers and the final RMSNorm, each rank's lm_head computes the logits "
        "of its half of the vocabulary, and an all-gather puts them side by side, so that both "
        "ranks hold the logits of the whole vocabulary. The lanes meet only at the collectives: "
        "two all-reduces per layer, one at the embedding and one all-gather at the LM head.",
    )
    x0, right = 84, 930  # the lanes' first step, the right margin
    bh, lane_gap = 56, 44  # a step's box height, the gap between the lanes' boxes
    coll_w, add_w = 74, 62

    s.text(
        8,
        26,
        "One decoder layer on two ranks: the lanes meet only at the collectives",
        size=15,
        bold=True,
    )

    def step_width(st: Step) -> float:
        kind = st[0]
        if kind == "op":
            _, title, mono, tag, r0, r1, _ = st
            widths = [text_width(title, 13, mono=mono, bold=True), text_width(tag, 12)]
            widths += [text_width(line, 12) for line in (*r0, *r1)]
            return max(widths) + 18
        if kind == "more":
            return text_width("2 all-reduces each", 12) + 18
        return coll_w if kind in ("all-reduce", "all-gather") else add_w

    def attach(st: Step, x: float, w: float) -> tuple[float, float]:
        """Where the lanes' arrows end at a step and leave it."""
        cx = x + w / 2
        if st[0] == "all-reduce":
            return cx - 12, cx + 12
        if st[0] == "all-gather":
            return cx - 14, cx + 14
        if st[0] == "add":
            return cx - 11, cx + 11
        return x, x + w

    pitch = 232
    for b, (frame, f0, f1, steps) in enumerate(BANDS):
        by = 44 + b * pitch
        tag_y = by + 34
        top = (by + 42, by + 42 + bh + lane_gap)  # the lanes' box tops
        mid = tuple(t + bh / 2 for t in top)  # the lanes' centre lines
        widths = [step_width(st) for st in steps]
        gap = min(34, max(18, (right - 40 - x0 - sum(widths)) / (len(steps) - 1)))
        xs = [x0 + sum(widths[:i]) + gap * i for i in range(len(steps))]
        if frame is not None:
            fx0 = xs[f0] - 9
            fx1 = xs[f1] + widths[f1] + 9
            s.box(
                fx0,
                by + 8,
                fx1 - fx0,
                top[1] + bh + 12 - by - 8,
                None,
                rx=12,
                dashed=True,
                stroke_width=1.1,
            )
            s.label_bg(fx0 + 12, by + 13, frame, size=12.5, anchor="start", bold=True, muted=True)
        for r in (0, 1):
            s.pill(8, mid[r], f"rank {r}", RANK_COLORS[r], size=12.5)
        prev_right = 70.0
        for st, x, w in zip(steps, xs, widths):
            kind = st[0]
            cx = x + w / 2
            left, out = attach(st, x, w)
            into = COLLECTIVE if kind in ("all-reduce", "all-gather") else None
            for r in (0, 1):
                s.arrow(prev_right + 2, mid[r], left - 2, mid[r], color=into, width=1.4)
            if kind == "op":
                _, title, mono, tag, r0, r1, split = st
                s.text(cx, tag_y, tag, size=12, anchor="middle", muted=True)
                for r, lines in ((0, r0), (1, r1)):
                    color = RANK_COLORS[r] if split else GREY
                    s.box(x, top[r], w, bh, color, rx=7, fill_opacity=0.2 if split else 0.14)
                    s.text(cx, top[r] + 18, title, size=13, anchor="middle", bold=True, mono=mono)
                    s.lines(cx, top[r] + 34, lines, size=12, anchor="middle", gap=1.25)
            elif kind == "more":
                s.text(cx, tag_y, "layers 1 … L−1", size=12, anchor="middle", muted=True)
                for r in (0, 1):
                    s.box(x, top[r], w, bh, None, rx=7, dashed=True, stroke_width=1.1)
                    s.text(cx, top[r] + 18, "⋯", size=15, anchor="middle", bold=True)
                    s.lines(
                        cx,
                        top[r] + 34,
                        ["the same, with", "2 all-reduces each"],
                        size=12,
                        anchor="middle",
                        gap=1.25,
                    )
            elif kind == "add":
                s.text(cx, tag_y, "+ residual", size=12, anchor="middle", muted=True)
                for r in (0, 1):
                    s.box(cx - 11, mid[r] - 11, 22, 22, GREY, rx=11, fill_opacity=0.2)
                    s.text(cx, mid[r] + 5.5, "+", size=15, anchor="middle", bold=True)
            else:  # a collective: a node on each lane, joined between the lanes
                gather = kind == "all-gather"
                for r in (0, 1):
                    if gather:  # the two halves side by side
                        for k in (0, 1):
                            s.box(
                                cx - 14 + 14 * k,
                                mid[r] - 9,
                                14,
                                18,
                                RANK_COLORS[k],
                                rx=2,
                                fill_opacity=0.45,
                                stroke_width=1.2,
                                solid_bg=True,
                            )
                    else:
                        s.box(
                            cx - 12,
                            mid[r] - 12,
                            24,
                            24,
                            COLLECTIVE,
                            rx=12,
                            fill_opacity=0.25,
                            solid_bg=True,
                        )
                        s.text(
                            cx,
                            mid[r] + 5.5,
                            "+",
                            size=16,
                            anchor="middle",
                            bold=True,
                            color=COLLECTIVE,
                        )
                d = 10 if gather else 13
                s.path(
                    f"M{cx},{mid[0] + d} L{cx},{mid[1] - d}",
                    color=COLLECTIVE,
                    width=2,
                    arrow_start=True,
                )
                s.label_bg(
                    cx, (mid[0] + mid[1]) / 2 + 4.5, kind, size=12.5, bold=True, color=COLLECTIVE
                )
            prev_right = out
        if b < len(BANDS) - 1:  # the lanes go on in the next row
            for r in (0, 1):
                s.arrow(prev_right + 2, mid[r], right, mid[r], width=1.4)

    # ---- the key
    ky = 44 + 2 * pitch + 42 + 2 * bh + lane_gap + 40
    s.text(
        8,
        ky,
        "2 all-reduces per layer, 1 at the embedding, 1 all-gather at the LM head",
        size=13.5,
        bold=True,
        color=COLLECTIVE,
    )
    ky += 28
    x = 8.0
    for color, fill, label in (
        (BLUE, 0.2, "rank 0's slice"),
        (ORANGE, 0.2, "rank 1's slice"),
        (GREY, 0.14, "whole: the same weights and result on both ranks"),
    ):
        s.box(x, ky - 12, 16, 16, color, rx=3, fill_opacity=fill, stroke_width=1.2)
        s.text(x + 22, ky, label, size=12.5)
        x += 22 + text_width(label, 12.5) + 26
    s.text(
        8,
        ky + 26,
        "In the code the residual add is done by the next RMSNorm (RMSNormFused adds, then "
        "normalises). V: the vocabulary's size.",
        size=12.5,
        muted=True,
    )
    return s.render()
