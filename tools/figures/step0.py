"""The figure of the step-0 page: the decode loop, with a contiguous KV cache."""

from __future__ import annotations

from tools.figures.svg import GREEN, ORANGE, PURPLE, Svg, num


def fig_step0_loop() -> str:
    """Prefill, then one token per decode step, with a contiguous KV cache."""
    s = Svg(
        "step0-loop",
        790,
        466,
        "The decode loop of step 0",
        "The prompt's tokens go through the model once (the prefill), which writes their keys and "
        "values into the KV cache and gives the first new token. Each decode step then runs only "
        "the newest token: it reads every earlier key and value from the cache, appends its own, "
        "and the argmax of its logits is the next token. The loop stops at an end-of-sequence "
        "token or after max_new_tokens tokens.",
    )
    tok_w, tok_h = 56, 34

    def token(x: float, y: float, label: str, color: str) -> None:
        s.box(x, y, tok_w, tok_h, color, rx=7, fill_opacity=0.25)
        s.text(x + tok_w / 2, y + tok_h / 2 + 5, label, size=14, anchor="middle")

    def model(x: float, y: float, w: float, sub: str) -> None:
        s.box(x, y, w, 64, PURPLE)
        s.text(x + w / 2, y + 27, "model", size=16, anchor="middle", bold=True)
        s.text(x + w / 2, y + 49, sub, size=13, anchor="middle", muted=True, mono=True)

    def argmax_then(x: float, y: float, out: str) -> float:
        """argmax box and output token from x; returns the token's right edge."""
        s.arrow(x, y + 32, x + 26, y + 32)
        s.box(x + 28, y + 15, 70, tok_h, None, rx=7)
        s.text(x + 63, y + 37, "argmax", size=13.5, anchor="middle", mono=True)
        s.arrow(x + 98, y + 32, x + 124, y + 32)
        token(x + 126, y + 15, out, GREEN)
        return x + 126 + tok_w

    # prefill row
    y1 = 44
    s.text(16, y1 - 14, "prefill: the whole prompt, once", size=15, bold=True, color=ORANGE)
    words = ["The", "capital", "of", "France", "is"]
    for i, w in enumerate(words):
        token(16 + i * (tok_w + 5), y1 + 15, w, ORANGE)
    px = 16 + len(words) * (tok_w + 5) + 6
    s.arrow(px, y1 + 32, px + 26, y1 + 32)
    mx1 = px + 28
    model(mx1, y1, 190, "forward(ids, start=0)")
    argmax_then(mx1 + 190, y1, "Paris")

    # KV cache strip
    ky = 184
    cells, cx0, cw = 12, 120, 55
    s.text(16, ky + 21, "KV cache", size=15, bold=True)
    s.text(16, ky + 40, "per layer", size=13, muted=True)
    for i in range(cells):
        x = cx0 + i * cw
        if i < 6:
            color = ORANGE if i < 5 else GREEN
            s.box(x, ky, cw - 5, 34, color, rx=4, fill_opacity=0.3, stroke_width=1.2)
            s.text(x + (cw - 5) / 2, ky + 22, "K, V", size=12.5, anchor="middle")
        else:
            s.box(x, ky, cw - 5, 34, None, rx=4, dashed=True, stroke_width=1)
        s.text(x + (cw - 5) / 2, ky + 53, str(i), size=12.5, anchor="middle", muted=True)
    s.text(
        cx0 + cells * cw - 5,
        ky - 10,
        "len(prompt) + max_new_tokens rows",
        size=13,
        anchor="end",
        muted=True,
    )
    # the prefill writes positions 0..4
    wx = cx0 + 2.5 * cw
    s.path(
        f"M{num(mx1 + 95)},{y1 + 64} V{y1 + 94} H{num(wx)} V{ky - 2}",
        color=ORANGE,
        width=1.6,
    )
    s.text(wx + 10, y1 + 114, "writes K, V of positions 0–4", size=13, color=ORANGE)

    # decode row
    y2 = 332
    s.text(16, y2 - 12, "decode: one token per step", size=15, bold=True, color=GREEN)
    token(16, y2 + 15, "Paris", GREEN)
    s.text(16 + tok_w / 2, y2 + 68, "position 5", size=12.5, anchor="middle", muted=True)
    dx = 16 + tok_w + 6
    s.arrow(dx, y2 + 32, dx + 26, y2 + 32)
    mx2 = dx + 28
    model(mx2, y2, 190, "forward(ids, start=5)")
    right = argmax_then(mx2 + 190, y2, ".")
    # reads all earlier K, V; appends its own at position 5
    rx = mx2 + 120
    s.arrow(rx, ky + 62, rx, y2 - 1, color=None, width=1.4)
    s.text(rx - 8, ky + 90, "reads K, V of 0–5", size=13, anchor="end")
    s.arrow(mx2 + 160, y2 - 1, cx0 + 5.5 * cw - 3, ky + 36, color=GREEN, width=1.6)
    s.text(cx0 + 5.5 * cw + 16, ky + 90, "appends its own K, V at 5", size=13, color=GREEN)

    # the loop back
    s.path(
        f"M{num(right)},{y2 + 32} H{num(right + 30)} V{y2 + 96} H{num(16 + tok_w / 2)} V{y2 + 80}",
        color=None,
        width=1.4,
        dashed=True,
    )
    s.text(
        (16 + right) / 2 + 20,
        y2 + 120,
        "feed the new token back; stop at EOS or after max_new_tokens",
        size=13,
        anchor="middle",
        muted=True,
    )
    return s.render()
