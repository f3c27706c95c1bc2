"""Figures of chapter 02: the residual stream through RMSNormFused, and Llama 3's RoPE scaling."""

from __future__ import annotations

import math
from itertools import pairwise

from tools.figures.svg import CYAN, GREEN, GREY, ORANGE, PURPLE, Svg


def fig_residual_stream() -> str:
    """A pre-norm decoder layer drawn around its residual stream."""
    s = Svg(
        "ch02-residual",
        1024,
        452,
        "The pre-norm decoder layer and the residual stream",
        "The embedding output enters the first RMSNormFused, which returns the normalised input "
        "of attention and starts the residual stream. The attention output goes into the next "
        "RMSNormFused, which adds it to the stream and normalises the sum for the MLP. The MLP "
        "output goes into the next layer's input norm (after the last layer, the final norm). No "
        "sub-layer adds its "
        "own output to the stream: the norm after it does.",
    )
    ys, fh = 100, 64  # stream centre line, height of a norm box
    fy = ys - fh / 2
    sub_y, sub_h = 236, 56

    def norm_box(x: float, w: float, title: str, sub: str) -> None:
        s.box(x, fy, w, fh, ORANGE, solid_bg=True)
        s.text(x + w / 2, fy + 27, title, size=13.5, anchor="middle", bold=True)
        s.text(x + w / 2, fy + 48, sub, size=12.5, anchor="middle", mono=True, muted=True)

    def sub_layer(x: float, w: float, title: str, sub: str) -> None:
        s.box(x, sub_y, w, sub_h, PURPLE)
        s.text(x + w / 2, sub_y + 24, title, size=15, anchor="middle", bold=True)
        s.text(x + w / 2, sub_y + 44, sub, size=12.5, anchor="middle", muted=True)

    # the layer's frame
    s.box(126, 40, 578, 292, None, rx=12, dashed=True, stroke_width=1.2)
    s.text(140, 322, "decoder layer 0", size=13, muted=True, italic=True)

    # the residual stream (drawn first, under the boxes)
    for xa, xb, label in [(320, 470, "residual = x"), (680, 852, "residual = x + residual")]:
        s.line(xa, ys, xb, ys, color=CYAN, width=7, opacity=0.45)
        s.text((xa + xb) / 2, ys - 12, label, size=12, anchor="middle", mono=True)
    s.line(1008, ys, 1022, ys, color=CYAN, width=7, opacity=0.45)
    s.text(954, 160, "after the last layer:", size=12, anchor="middle", muted=True)
    s.text(954, 176, "the final norm", size=12, anchor="middle", muted=True)
    s.text(
        520,
        24,
        "the residual stream: the running sum of the embedding and of every sub-layer output",
        size=13,
        anchor="middle",
        color=CYAN,
    )

    # embedding -> first norm
    s.box(12, ys - 24, 98, 48, GREY)
    s.text(61, ys + 5, "embedding", size=13.5, anchor="middle", bold=True)
    s.arrow(110, ys, 138, ys, color=None)
    s.text(124, ys - 10, "x", size=13, anchor="middle", mono=True)

    norm_box(140, 180, "input_layernorm", "forward(x, None)")
    norm_box(470, 210, "post_attention_layernorm", "forward(x, residual)")
    norm_box(852, 156, "input_layernorm", "of layer 1")

    # norm -> attention, attention -> next norm
    sub_layer(160, 140, "attention", "q/k/v, RoPE, o_proj")
    s.arrow(230, fy + fh, 230, sub_y - 2, color=ORANGE)
    s.label_bg(230, 186, "norm(x)", size=12.5, mono=True)
    s.path(f"M300,{sub_y + sub_h / 2} H500 V{fy + fh + 2}", color=PURPLE)
    s.text(
        400, sub_y + sub_h / 2 + 22, "x = attention output", size=12.5, anchor="middle", mono=True
    )

    # norm -> MLP, MLP -> next norm
    sub_layer(530, 140, "MLP", "silu_and_mul, down")
    s.arrow(600, fy + fh, 600, sub_y - 2, color=ORANGE)
    s.label_bg(600, 186, "norm(x + residual)", size=12.5, mono=True)
    s.path(f"M670,{sub_y + sub_h / 2} H882 V{fy + fh + 2}", color=PURPLE)
    s.text(776, sub_y + sub_h / 2 + 22, "x = MLP output", size=12.5, anchor="middle", mono=True)

    # the contract
    y = 376
    s.text(16, y, "RMSNormFused.forward(x, None)", size=13.5, mono=True, bold=True)
    s.text(300, y, "→  (norm(x), x)", size=13.5, mono=True)
    s.text(680, y, "the first layer starts the stream", size=13, muted=True)
    s.text(16, y + 24, "RMSNormFused.forward(x, residual)", size=13.5, mono=True, bold=True)
    s.text(300, y + 24, "→  (norm(x + residual), x + residual)", size=13.5, mono=True)
    s.text(680, y + 24, "every later norm adds, then normalises", size=13, muted=True)
    s.text(
        16,
        y + 56,
        "The textbook form h = x + attention(norm(x)); out = h + mlp(norm(h)) "
        "computes the same sums; here each addition happens inside the next norm.",
        size=13,
        muted=True,
    )
    return s.render()


def fig_llama3_rope() -> str:
    """Wavelength of each RoPE frequency, plain and with Llama 3 scaling (tiny-llama3's numbers)."""
    base, dim = 500000.0, 128
    factor, low, high, original = 8.0, 1.0, 4.0, 64
    n = dim // 2
    inv = [1.0 / base ** (2 * i / dim) for i in range(n)]
    plain = [2 * math.pi / f for f in inv]

    def scaled_wavelength(f: float) -> float:
        w = 2 * math.pi / f
        if w < original / high:
            return w
        if w > original / low:
            return w * factor
        smooth = (original / w - low) / (high - low)
        return 2 * math.pi / ((1 - smooth) * f / factor + smooth * f)

    scaled = [scaled_wavelength(f) for f in inv]
    kept = sum(w < original / high for w in plain)
    ramp = sum(original / high <= w <= original / low for w in plain)
    slowed = n - kept - ramp

    x0, y0, pw, ph = 120, 70, 690, 300  # plot area
    lo, hi = 0.0, 8.0  # log10 of the wavelength, in tokens

    def px(i: float) -> float:
        return x0 + (i + 0.5) * pw / n

    def py(w: float) -> float:
        return y0 + ph - (math.log10(w) - lo) / (hi - lo) * ph

    s = Svg(
        "ch02-llama3-rope",
        900,
        540,
        "Which RoPE frequencies Llama 3 scaling changes",
        f"The {n} rotary frequencies of a head of size {dim} with base {base:g}, as wavelengths in "
        f"tokens on a log scale. With factor {factor:g}, low_freq_factor {low:g}, "
        f"high_freq_factor {high:g} and original_max_position_embeddings {original}: the {kept} "
        f"fastest frequencies (wavelength under {original / high:g} tokens) are kept, the "
        f"{slowed} slowest (wavelength over {original / low:g} tokens) are divided by {factor:g}, "
        f"and the {ramp} in between are blended.",
    )
    # bands
    edges = [0, kept, kept + ramp, n]
    bands = [(GREEN, "kept"), (ORANGE, "blended"), (CYAN, f"divided by {factor:g}")]
    for (a, b), (color, label) in zip(pairwise(edges), bands, strict=True):
        xa, xb = x0 + a * pw / n, x0 + b * pw / n
        s.box(xa, y0, xb - xa, ph, color, rx=0, fill_opacity=0.1, stroke_width=0)
        stagger = 18 if label == "kept" else 0  # the two narrow bands' labels would touch
        s.text(
            (xa + xb) / 2,
            y0 - 8 - stagger,
            f"{label} ({b - a})",
            size=13,
            anchor="middle",
            bold=True,
            color=color,
        )
    # axes
    s.line(x0, y0 + ph, x0 + pw, y0 + ph, color=None, width=1.2)
    s.line(x0, y0, x0, y0 + ph, color=None, width=1.2)
    for e in range(int(lo), int(hi) + 1):
        y = py(10**e)
        s.line(x0 - 5, y, x0 + pw, y, color=None, width=0.6, opacity=0.15)
        s.text(
            x0 - 9,
            y + 4,
            "1" if e == 0 else "10" + "⁰¹²³⁴⁵⁶⁷⁸⁹"[e] if e > 1 else "10",
            size=12,
            anchor="end",
            muted=True,
        )
    for i in (0, 8, 16, 24, 32, 40, 48, 56, 63):
        s.text(px(i), y0 + ph + 18, str(i), size=12, anchor="middle", muted=True)
    s.text(
        x0 + pw / 2,
        y0 + ph + 40,
        "frequency index i  (inv_freq = base^(−2i/d): faster on the left, slower on the right)",
        size=13,
        anchor="middle",
    )
    s.text(50, y0 + ph / 2 - 10, "wavelength", size=13, anchor="middle")
    s.text(50, y0 + ph / 2 + 8, "(tokens)", size=13, anchor="middle", muted=True)
    # thresholds
    for w, label in [
        (original / high, f"{original}/{high:g} = {original / high:g}"),
        (original / low, f"{original}/{low:g} = {original / low:g}"),
    ]:
        y = py(w)
        s.line(x0, y, x0 + pw, y, color=None, width=1, dashed=True, opacity=0.6)
        s.text(x0 + pw + 6, y + 4, label, size=12, mono=True, muted=True)
    # the two curves
    for values, color, r in [(plain, GREY, 3.2), (scaled, ORANGE, 3.2)]:
        d = " ".join(
            f"{'M' if i == 0 else 'L'}{px(i):.1f},{py(w):.1f}" for i, w in enumerate(values)
        )
        s.path(d, color=color, width=1.6, arrow_end=False)
        for i, w in enumerate(values):
            s.body.append(f'<circle cx="{px(i):.1f}" cy="{py(w):.1f}" r="{r}" fill="{color}"/>')
    # legend
    ly = y0 + ph + 70
    s.line(x0, ly, x0 + 28, ly, color=GREY, width=2)
    s.text(x0 + 36, ly + 4, "plain: 2π / inv_freq", size=13)
    s.line(x0 + 230, ly, x0 + 258, ly, color=ORANGE, width=2)
    s.text(x0 + 266, ly + 4, "llama3-scaled (factor 8, tiny-llama3's config)", size=13)
    notes = [
        f"A wavelength under {original / high:g} tokens turns many times within the original "
        f"{original}-token context: it is kept.",
        f"One over {original / low:g} tokens does not finish a single turn there: slowed down "
        f"{factor:g} times, it gives a {factor:g}× longer context",
        "only angles the model has seen. The ones in between are blended.",
    ]
    s.lines(x0, ly + 32, notes, size=13, muted=True, gap=1.4)
    return s.render()
