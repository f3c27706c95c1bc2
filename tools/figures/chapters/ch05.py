"""Figures of chapter 05 (attention backend).

ch05-ragged-batch  the main's prefill batch: 10 tokens of three requests in a row, padded into
                   a rectangle of queries, and each request's mask over its keys
ch05-backend-flow  prepare_metadata once per batch, then every layer's forward reads it
"""

from __future__ import annotations

from tools.figures.svg import BLUE, CYAN, GREY, ORANGE, PURPLE, TEAL, Svg

# The batch of examples/ch05_attention.py::show_ragged_batch (its printed output shows the same
# numbers): per request, new tokens, cached prefix and its row of the page table.
REQS = [
    ("request 0", 5, 0, [8, 9, 10, 11, 12], ORANGE),
    ("request 1", 3, 4, [0, 1, 2, 3, 16, 17, 18], BLUE),
    ("request 2", 2, 0, [20, 21], TEAL),
]


def fig_ragged_batch() -> str:
    max_q = max(n for _, n, _, _, _ in REQS)
    max_k = max(n + c for _, n, c, _, _ in REQS)
    s = Svg(
        "ch05-ragged-batch",
        940,
        622,
        "A ragged prefill batch padded into a rectangle",
        "Three requests bring 5, 3 and 2 new tokens; request 1 also has 4 cached tokens. The "
        "batch is one row of 10 tokens, with offsets cu_seqlens_q 0, 5, 8, 10. The backend pads "
        "the queries into a 3 by 5 rectangle (query_index, with padding marked invalid) and "
        "gathers each request's keys into a 3 by 7 rectangle through the page table (kv_slots). "
        "For each request, a 5 by 7 mask lets query i, at position cached_len + i, see keys 0 to "
        "cached_len + i; padding rows and keys past the request's length see nothing.",
    )
    cw = 54
    # --- the batch as the model sees it -----------------------------------------------------
    x0, y0 = 150, 62
    s.text(20, 28, "the batch: every request's new tokens, one after another", size=15, bold=True)
    s.text(20, y0 + 24, "input_ids", size=13.5, mono=True)
    s.text(20, y0 + 42, "(positions)", size=12.5, muted=True)
    col = 0
    for name, n, cached, _, color in REQS:
        gx = x0 + col * cw
        for i in range(n):
            x = gx + i * cw
            s.box(x, y0, cw - 4, 34, color, rx=6, fill_opacity=0.3)
            s.text(x + (cw - 4) / 2, y0 + 22, f"p{cached + i}", size=13, anchor="middle", mono=True)
            s.text(x + (cw - 4) / 2, y0 - 8, str(col + i), size=11.5, anchor="middle", muted=True)
        label = f"r{REQS.index((name, n, cached, _, color))}: {n} new" + (
            f" + {cached} cached" if cached else ""
        )
        s.text(gx + (n * cw - 4) / 2, y0 + 56, label, size=12.5, anchor="middle", color=color)
        col += n
    # cu_seqlens_q ticks
    ty = y0 + 76
    s.text(20, ty + 14, "cu_seqlens_q", size=13.5, mono=True)
    offsets = [0]
    for _, n, _, _, _ in REQS:
        offsets.append(offsets[-1] + n)
    for off in offsets:
        x = x0 + off * cw - 2
        s.line(x, ty - 2, x, ty + 8, color=None, width=1.6)
        s.text(x, ty + 24, str(off), size=13, anchor="middle", mono=True, bold=True)
    s.text(
        x0 + offsets[-1] * cw + 20,
        ty + 14,
        f"last tokens: {', '.join(str(o - 1) for o in offsets[1:])}",
        size=13,
        muted=True,
    )

    # --- the query rectangle ------------------------------------------------------------------
    qy = 226
    s.text(20, qy - 28, f"queries, padded: [{len(REQS)}, {max_q}]", size=15, bold=True)
    s.lines(
        20,
        qy + 2 - 8,
        ["query_index: the batch row of each query;", "dashed: padding (query_valid is False)"],
        size=12.5,
        muted=True,
        gap=1.3,
    )
    qc = 40
    qx0 = 110
    off = 0
    for r, (_, n, _, _, color) in enumerate(REQS):
        y = qy + 26 + r * (qc + 4)
        s.text(qx0 - 12, y + 25, f"r{r}", size=13.5, anchor="end", bold=True, color=color)
        for i in range(max_q):
            x = qx0 + i * (qc + 4)
            if i < n:
                s.box(x, y, qc, qc, color, rx=5, fill_opacity=0.3)
                s.text(x + qc / 2, y + 25, str(off + i), size=13.5, anchor="middle", mono=True)
            else:
                s.box(x, y, qc, qc, None, rx=5, dashed=True, stroke_width=1)
                s.text(x + qc / 2, y + 25, "0", size=13, anchor="middle", mono=True, muted=True)
        off += n

    # --- the key rectangle ---------------------------------------------------------------------
    kx0 = 430
    s.text(kx0, qy - 28, f"keys, gathered: [{len(REQS)}, {max_k}]", size=15, bold=True)
    s.lines(
        kx0,
        qy + 2 - 8,
        [
            "kv_slots: the request's page-table row, its K/V slots",
            "in the pool; dashed: past its length (masked)",
        ],
        size=12.5,
        muted=True,
        gap=1.3,
    )
    kc = 40
    for r, (_, n, cached, slots, color) in enumerate(REQS):
        y = qy + 26 + r * (kc + 4)
        for j in range(max_k):
            x = kx0 + 20 + j * (kc + 4)
            if j < n + cached:
                c = CYAN if j < cached else color
                s.box(x, y, kc, kc, c, rx=5, fill_opacity=0.3)
                s.text(x + kc / 2, y + 25, str(slots[j]), size=13.5, anchor="middle", mono=True)
            else:
                s.box(x, y, kc, kc, None, rx=5, dashed=True, stroke_width=1)
                s.text(x + kc / 2, y + 25, "0", size=13, anchor="middle", mono=True, muted=True)
    s.text(kx0 + 20 + max_k * (kc + 4) + 6, qy + 26 + 44 + 18, "request 1's", size=12.5, color=CYAN)
    s.text(
        kx0 + 20 + max_k * (kc + 4) + 6, qy + 26 + 44 + 34, "cached prefix:", size=12.5, color=CYAN
    )
    s.text(
        kx0 + 20 + max_k * (kc + 4) + 6,
        qy + 26 + 44 + 50,
        "request 0's slots",
        size=12.5,
        color=CYAN,
    )

    # --- the masks ----------------------------------------------------------------------------
    my = 424
    s.text(
        20,
        my - 4,
        f"mask [{len(REQS)}, 1, {max_q}, {max_k}]: query i of a request sees keys 0 .. cached_len "
        "+ i",
        size=15,
        bold=True,
    )
    mc = 19
    for r, (name, n, cached, _, color) in enumerate(REQS):
        bx = 70 + r * 300
        by = my + 40
        s.text(
            bx + max_k * mc / 2, by - 16, name, size=13.5, anchor="middle", bold=True, color=color
        )
        for j in range(max_k):
            s.text(bx + j * mc + mc / 2, by - 2, f"k{j}", size=10.5, anchor="middle", muted=True)
        for i in range(max_q):
            y = by + 4 + i * mc
            label = f"q{cached + i}" if i < n else "pad"
            s.text(bx - 6, y + 14, label, size=11.5, anchor="end", muted=i >= n, mono=True)
            for j in range(max_k):
                x = bx + j * mc
                visible = i < n and j <= cached + i
                if visible:
                    c = CYAN if j < cached else color
                    s.box(x + 1, y + 1, mc - 2, mc - 2, c, rx=3, fill_opacity=0.55, stroke_width=1)
                else:
                    s.box(x + 1, y + 1, mc - 2, mc - 2, None, rx=3, stroke_width=0.6, dashed=i >= n)
    ly = my + 40 + max_q * mc + 34
    s.box(70, ly - 13, 16, 16, GREY, rx=3, fill_opacity=0.55, stroke_width=1)
    s.text(94, ly, "visible (True)", size=13)
    s.box(220, ly - 13, 16, 16, None, rx=3, stroke_width=0.6)
    s.text(244, ly, "masked: a later position, or past the request's length", size=13)
    s.box(600, ly - 13, 16, 16, None, rx=3, stroke_width=0.6, dashed=True)
    s.text(624, ly, "padding row: sees nothing, dropped", size=13)
    return s.render()


def fig_backend_flow() -> str:
    s = Svg(
        "ch05-backend-flow",
        940,
        520,
        "Metadata once per batch, then every layer's attention",
        "The caller builds a batch and calls attn_backend.prepare_metadata(batch) once. It stores "
        "cu_seqlens_q, query_index, query_valid, kv_slots and the mask in batch.attn_metadata. "
        "Then model.forward runs inside ctx.forward_batch(batch). In every layer, AttentionLayer "
        "applies the q and k norms and RoPE and calls ctx.attn_backend.forward, which stores the "
        "new keys and values, gathers each request's keys and values, and runs one masked "
        "attention. After the last layer, a prefill keeps each request's last token and the LM "
        "head turns it into logits.",
    )
    # row 1: batch -> prepare_metadata -> attn_metadata
    s.box(20, 20, 230, 124, GREY)
    s.text(135, 46, "Batch", size=16, anchor="middle", bold=True)
    s.lines(
        36,
        72,
        ["input_ids, positions", "out_loc (K/V slots)", "padded_reqs, phase"],
        size=13,
        mono=True,
    )
    s.text(135, 162, "built by the caller", size=12.5, anchor="middle", muted=True)
    s.arrow(252, 82, 298, 82)
    s.box(300, 40, 250, 84, PURPLE)
    s.text(425, 72, "prepare_metadata(batch)", size=15, anchor="middle", bold=True, mono=True)
    s.text(425, 96, "once per batch", size=13, anchor="middle", muted=True)
    s.arrow(552, 82, 598, 82)
    s.box(600, 14, 320, 136, CYAN)
    s.text(760, 40, "batch.attn_metadata", size=15, anchor="middle", bold=True, mono=True)
    s.lines(
        616,
        64,
        [
            "cu_seqlens_q  [bs + 1]",
            "query_index   [bs, max_q]",
            "query_valid   [bs, max_q]",
            "kv_slots      [bs, max_k]",
            "mask          [bs, 1, max_q, max_k]",
        ],
        size=12.5,
        mono=True,
        gap=1.45,
    )

    # the forward pass frame
    fy = 190
    s.box(20, fy, 900, 252, None, rx=14, dashed=True, stroke_width=1.2)
    s.label_bg(
        40,
        fy + 5,
        "model.forward() inside ctx.forward_batch(batch)",
        size=14,
        anchor="start",
        mono=True,
        bold=True,
    )
    # layer stack
    ly = fy + 34
    names = ["layer 0", "layer 1", "...", "layer L-1"]
    for i, name in enumerate(names):
        y = ly + i * 52
        if name == "...":
            s.text(110, y + 26, "⋮", size=20, anchor="middle", muted=True)
            continue
        s.box(
            40, y, 140, 40, ORANGE if i == 1 else GREY, rx=8, fill_opacity=0.25 if i == 1 else 0.12
        )
        s.text(110, y + 25, name, size=14, anchor="middle", bold=i == 1)
    # expanded layer 1
    s.path(f"M182,{ly + 72} L208,{ly + 72}", color=ORANGE)
    s.box(210, ly, 250, 196, ORANGE)
    s.text(335, ly + 26, "AttentionLayer.forward", size=14.5, anchor="middle", bold=True, mono=True)
    s.lines(
        226,
        ly + 56,
        [
            "split qkv into q, k, v",
            "q_norm, k_norm (Qwen3)",
            "RoPE at batch.positions",
            "",
            "then hand over:",
        ],
        size=13,
        gap=1.5,
    )
    s.text(335, ly + 176, "ctx.attn_backend.forward(...)", size=12.5, anchor="middle", mono=True)
    s.arrow(462, ly + 98, 498, ly + 98, color=ORANGE)
    s.box(500, ly, 400, 196, PURPLE)
    s.text(
        700, ly + 24, "TorchNativeBackend.forward", size=14.5, anchor="middle", bold=True, mono=True
    )
    s.text(
        700,
        ly + 42,
        "(q, k, v, layer_id, batch)",
        size=12.5,
        anchor="middle",
        mono=True,
        muted=True,
    )
    steps = [
        "1  store_kv(k, v, batch.out_loc, layer_id)",
        "2  keys, values = pool[kv_slots]",
        "3  repeat_interleave for GQA",
        "4  queries = q[query_index]",
        "5  scaled_dot_product_attention(mask)",
        "6  keep rows where query_valid",
    ]
    s.lines(516, ly + 68, steps, size=12.5, mono=True, gap=1.55)
    # metadata is read by every layer
    s.path(f"M760,152 L760,{ly - 2}", color=CYAN, dashed=True, width=1.6)
    s.label_bg(760, fy + 22, "read by every layer, never rebuilt", size=12.5, color=CYAN)
    # after the layers
    oy = 462
    s.box(20, oy, 420, 44, GREY, rx=8)
    s.text(
        230, oy + 27, "prefill: hidden[get_last_indices(bs)]", size=13.5, anchor="middle", mono=True
    )
    s.arrow(442, oy + 22, 478, oy + 22)
    s.box(480, oy, 150, 44, GREY, rx=8)
    s.text(555, oy + 27, "lm_head", size=14, anchor="middle", mono=True)
    s.arrow(632, oy + 22, 668, oy + 22)
    s.box(670, oy, 250, 44, ORANGE, rx=8)
    s.text(795, oy + 27, "logits [bs, vocab]", size=14, anchor="middle", mono=True)
    s.arrow(110, fy + 252, 110, oy - 2, color=None, width=1.4)
    return s.render()
