"""Figures of chapter 03 (model and weights).

ch03-weight-names  SmolLM2's checkpoint names, in file order, and the names the streaming loader
                   yields: q/k/v become qkv_proj, gate/up become gate_up_proj
ch03-decoder       the one generic decoder: which attribute holds what (the attribute path is
                   the weight's name), and the two flags the four architectures set
"""

from __future__ import annotations

from tools.figures.svg import CYAN, GREEN, GREY, ORANGE, PURPLE, TEAL, Svg

# SmolLM2-135M: hidden 576, 9 query heads and 3 KV heads of 64 dims, MLP 1536, 30 layers.
# Checkpoint order is safetensors' (alphabetical) order, as the loader reads it.
LAYER = "model.layers.0."
LEFT = [  # (name, shape, group colour or None, is a layer tensor)
    ("model.embed_tokens.weight", "[49152, 576]", None, False),
    ("input_layernorm.weight", "[576]", None, True),
    ("mlp.down_proj.weight", "[576, 1536]", None, True),
    ("mlp.gate_proj.weight", "[1536, 576]", TEAL, True),
    ("mlp.up_proj.weight", "[1536, 576]", TEAL, True),
    ("post_attention_layernorm.weight", "[576]", None, True),
    ("self_attn.k_proj.weight", "[192, 576]", PURPLE, True),
    ("self_attn.o_proj.weight", "[576, 576]", None, True),
    ("self_attn.q_proj.weight", "[576, 576]", PURPLE, True),
    ("self_attn.v_proj.weight", "[192, 576]", PURPLE, True),
    ("model.norm.weight", "[576]", None, False),
]
# what the loader yields, at the row of the checkpoint tensor that lets it yield
RIGHT = {
    0: ("model.embed_tokens.weight", "", None),
    1: ("input_layernorm.weight", "", None),
    2: ("mlp.down_proj.weight", "", None),
    4: ("mlp.gate_up_proj.weight", "[3072, 576]", TEAL),
    5: ("post_attention_layernorm.weight", "", None),
    7: ("self_attn.o_proj.weight", "", None),
    9: ("self_attn.qkv_proj.weight", "[960, 576]", PURPLE),
    10: ("model.norm.weight", "", None),
}


def fig_weight_names() -> str:
    """Checkpoint tensors on the left, yielded tensors on the right, merges in the middle."""
    lx, lw = 16, 318  # left column
    rx, rw = 478, 306  # right column
    top, pitch, bh = 96, 34, 26
    # rows: 0 is the embedding, 1..9 layer 0, then a gap for the other layers, then the norm
    ys = []
    y = top
    for i in range(len(LEFT)):
        if i == 1:
            y += 24  # room for the "model.layers.0." header
        if i == len(LEFT) - 1:
            y += 30  # room for "layers 1 ... 29"
        ys.append(y)
        y += pitch
    height = ys[-1] + bh + 136
    s = Svg(
        "ch03-weight-names",
        800,
        height,
        "Checkpoint names and the names the loader yields",
        "On the left, SmolLM2's checkpoint tensors in the order the file lists them: the "
        "embedding, then for each layer the two norms, down_proj, gate_proj, up_proj, k_proj, "
        "o_proj, q_proj and v_proj, then the final norm. On the right, what load_weight yields, "
        "at the moment it can yield it. Most tensors pass through unchanged. gate_proj waits "
        "until up_proj arrives, and the two leave as one gate_up_proj of 3072 rows. k_proj and "
        "q_proj wait until v_proj arrives, and the three leave as one qkv_proj of 960 rows, in "
        "q, k, v order. 272 tensors in the file become 182.",
    )
    s.text(lx, 30, "checkpoint: model.safetensors", size=15, bold=True)
    s.text(lx, 50, "272 tensors, in file order", size=13, muted=True)
    s.text(rx, 30, "yielded by load_weight", size=15, bold=True)
    s.text(rx, 50, "182 tensors, our model's names", size=13, muted=True)
    header_y = ys[1] - 10
    s.text(lx + 2, header_y, LAYER + "…", size=12.5, mono=True, muted=True)
    s.text(rx + 2, header_y, LAYER + "…", size=12.5, mono=True, muted=True)
    gap_y = ys[-1] - 12
    s.text(400, gap_y, "… the same for layers 1 to 29 …", size=13, anchor="middle", muted=True)

    def row(x: float, y: float, w: float, name: str, shape: str, color: str | None) -> None:
        s.box(x, y, w, bh, color, rx=6, fill_opacity=0.2 if color else 0.18, stroke_width=1.2)
        s.text(x + 8, y + 17.5, name, size=12.5, mono=True)
        if shape:
            s.text(x + w - 8, y + 17.5, shape, size=12, anchor="end", muted=True, mono=True)

    for i, (name, shape, color, _) in enumerate(LEFT):
        row(lx, ys[i], lw, name, shape, color)
    for i, (name, shape, color) in RIGHT.items():
        row(rx, ys[i], rw, name, shape, color)

    # straight arrows for the tensors that pass through; converging ones for the groups
    mid = lambda i: ys[i] + bh / 2  # noqa: E731
    for i in RIGHT:
        if LEFT[i][2] is None:
            s.arrow(lx + lw + 2, mid(i), rx - 3, mid(i), color=None, width=1.2, opacity=0.55)
    for sources, target, color in (([3, 4], 4, TEAL), ([6, 8, 9], 9, PURPLE)):
        jx = 430
        for i in sources:
            s.path(
                f"M{lx + lw + 2},{mid(i)} "
                f"C{jx - 40},{mid(i)} {jx - 40},{mid(target)} {jx},{mid(target)}",
                color=color,
                width=1.6,
                arrow_end=False,
            )
        s.arrow(jx, mid(target), rx - 3, mid(target), color=color, width=1.8)
        s.label_bg(jx - 14, mid(target) + 4.5, "cat", size=12, mono=True, bold=True, color=color)
    # what waits
    s.text(400, mid(3) - 2, "gate waits", size=12.5, anchor="middle", color=TEAL)
    s.text(400, mid(6) - 2, "k waits", size=12.5, anchor="middle", color=PURPLE)
    s.text(400, mid(8) - 8, "q waits", size=12.5, anchor="middle", color=PURPLE)

    # the merged layouts
    bx, bar = lx + 200, 400
    qy = ys[-1] + bh + 26
    s.text(lx, qy + 15.5, "qkv_proj.weight rows", size=13, bold=True)
    unit = bar / 960
    for label, rows, start in (
        ("q  0–575", 576, 0),
        ("k  576–767", 192, 576),
        ("v  768–959", 192, 768),
    ):
        x = bx + start * unit
        s.box(
            x,
            qy,
            rows * unit - 2,
            22,
            PURPLE,
            rx=4,
            fill_opacity=0.12 + 0.1 * (start > 0),
            stroke_width=1,
        )
        s.text(x + rows * unit / 2 - 1, qy + 15.5, label, size=12, anchor="middle", mono=True)
    s.text(bx + bar + 10, qy + 15.5, "(9 + 3 + 3) heads × 64", size=12.5, muted=True)
    gy = qy + 34
    s.text(lx, gy + 15.5, "gate_up_proj.weight rows", size=13, bold=True)
    unit2 = bar / 3072
    for label, start in (("gate  0–1535", 0), ("up  1536–3071", 1536)):
        x = bx + start * unit2
        s.box(
            x,
            gy,
            1536 * unit2 - 2,
            22,
            TEAL,
            rx=4,
            fill_opacity=0.12 + 0.1 * (start > 0),
            stroke_width=1,
        )
        s.text(x + 1536 * unit2 / 2 - 1, gy + 15.5, label, size=12, anchor="middle", mono=True)
    s.text(bx + bar + 10, gy + 15.5, "2 × 1536", size=12.5, muted=True)
    s.text(
        lx,
        gy + 50,
        "There is no lm_head.weight: SmolLM2 ties its output projection to embed_tokens.",
        size=12.5,
        muted=True,
    )
    return s.render()


# the four architectures and their two flags
ARCHS = [
    ("LlamaForCausalLM", False, False),
    ("MistralForCausalLM", False, False),
    ("Qwen2ForCausalLM", True, False),
    ("Qwen3ForCausalLM", False, True),
]


def fig_decoder() -> str:
    """DecoderForCausalLM, its parts by attribute name, and the flags of the four classes."""
    s = Svg(
        "ch03-decoder",
        800,
        574,
        "The generic decoder and its attribute names",
        "DecoderForCausalLM holds model, a DecoderModel, and lm_head. DecoderModel holds "
        "embed_tokens, layers (an OPList of DecoderLayer, named 0, 1, 2 and so on) and norm. "
        "A DecoderLayer holds input_layernorm, self_attn, post_attention_layernorm and mlp. "
        "self_attn, a RopeAttn, holds qkv_proj, the optional q_norm and k_norm, attn (the "
        "AttentionLayer, no weights) and o_proj. mlp, a GatedMLP, holds gate_up_proj and "
        "down_proj. The path of attributes is the weight's name. Four classes, Llama, Mistral, "
        "Qwen2 and Qwen3, only set two flags: has_attn_bias adds a bias to qkv_proj (Qwen2); "
        "has_qk_norm adds q_norm and k_norm (Qwen3).",
    )

    def part(
        x: float, y: float, w: float, h: float, attr: str, cls: str, color: str | None
    ) -> None:
        s.box(x, y, w, h, color, rx=8, fill_opacity=0.14, stroke_width=1.3, solid_bg=True)
        s.text(x + 10, y + 19, attr, size=13, mono=True, bold=True)
        if cls:
            s.text(x + w - 10, y + 19, cls, size=12.5, anchor="end", muted=True)

    # outer class
    ox, oy, ow, oh = 14, 14, 500, 546
    s.box(ox, oy, ow, oh, None, rx=12, stroke_width=1.2)
    s.text(ox + 12, oy + 22, "DecoderForCausalLM", size=15, bold=True)
    s.text(
        ox + ow - 12,
        oy + 22,
        "forward(): ids from the batch → logits",
        size=12.5,
        anchor="end",
        muted=True,
    )
    # model
    mx, my, mw, mh = ox + 14, oy + 36, ow - 28, 452
    part(mx, my, mw, mh, "model", "DecoderModel", None)
    part(mx + 12, my + 30, mw - 24, 28, "embed_tokens", "VocabParallelEmbedding", CYAN)
    # layers
    lx, ly, lw, lh = mx + 12, my + 68, mw - 24, 334
    for off in (10, 5):
        s.box(
            lx + off,
            ly + off,
            lw - 10,
            lh - 10,
            GREY,
            rx=8,
            fill_opacity=0.06,
            stroke_width=1,
            solid_bg=True,
        )
    part(lx, ly, lw - 10, lh - 10, "layers.0", "DecoderLayer  (× num_layers)", GREY)
    ix, iw = lx + 12, lw - 34
    part(ix, ly + 30, iw, 28, "input_layernorm", "RMSNormFused: + residual", CYAN)
    # attention block
    ay = ly + 66
    part(ix, ay, iw, 144, "self_attn", "RopeAttn", PURPLE)
    sub_x, sub_w = ix + 12, iw - 24
    part(sub_x, ay + 28, sub_w, 24, "qkv_proj", "LinearQKVMerged (+ bias?)", PURPLE)
    part(sub_x, ay + 56, sub_w, 24, "q_norm, k_norm", "RMSNorm, or None", PURPLE)
    part(sub_x, ay + 84, sub_w, 24, "attn", "AttentionLayer: RoPE, attention", PURPLE)
    part(sub_x, ay + 112, sub_w, 24, "o_proj", "LinearOProj", PURPLE)
    part(ix, ay + 152, iw, 28, "post_attention_layernorm", "RMSNormFused", CYAN)
    # mlp block
    my2 = ay + 188
    part(ix, my2, iw, 56, "mlp", "GatedMLP", TEAL)
    s.text(ix + 22, my2 + 42, "gate_up_proj → silu_and_mul → down_proj", size=12.5, mono=True)
    part(mx + 12, my + mh - 42, mw - 24, 28, "norm", "RMSNormFused", CYAN)
    part(
        ox + 14,
        oy + oh - 46,
        ow - 28,
        30,
        "lm_head",
        "ParallelLMHead (tied → embed_tokens)",
        ORANGE,
    )

    # the flags, on the right
    tx = 532
    c1, c2 = tx + 164, tx + 226
    s.text(tx, 36, "four thin classes", size=15, bold=True)
    s.text(tx, 56, "models/llama.py, mistral.py, …", size=12.5, muted=True)
    s.text(c1, 84, "attn_bias", size=12.5, anchor="middle", muted=True)
    s.text(c2, 84, "qk_norm", size=12.5, anchor="middle", muted=True)
    # where each flag lands: the qkv_proj row and the q_norm/k_norm row
    edge = sub_x + sub_w + 3
    qkv_mid, norm_mid = ay + 28 + 12, ay + 56 + 12
    s.path(f"M{c1},{106 + 2 * 28 + 6} V{qkv_mid} H{edge}", color=GREEN, width=1.5)
    s.label_bg(592, qkv_mid + 4.5, "a bias", size=12.5, color=GREEN)
    s.path(f"M{c2},{106 + 3 * 28 + 6} V{norm_mid} H{edge}", color=GREEN, width=1.5)
    s.label_bg(620, norm_mid + 4.5, "q_norm and k_norm", size=12.5, color=GREEN)
    for i, (name, bias, norm) in enumerate(ARCHS):
        y = 106 + i * 28
        s.text(tx, y, name, size=12.5, mono=True)
        for col, flag in ((c1, bias), (c2, norm)):
            if flag:
                s.text(col, y, "yes", size=13, anchor="middle", bold=True, color=GREEN)
            else:
                s.label_bg(col, y, "–", size=13, pad=6)
    s.lines(
        tx,
        400,
        [
            "The path of attributes is the",
            "weight's name:",
        ],
        size=13,
        muted=True,
    )
    s.text(tx, 444, "model.layers.0.self_attn.", size=12.5, mono=True)
    s.text(tx, 462, "    qkv_proj.weight", size=12.5, mono=True)
    s.lines(
        tx,
        494,
        ["the name load_weight yields, so", "load_state_dict just swaps it in."],
        size=13,
        muted=True,
    )
    return s.render()
