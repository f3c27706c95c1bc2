"""Figures of chapter 01: a request's lengths as the engine runs it."""

from __future__ import annotations

from tools.figures.svg import CYAN, GREEN, ORANGE, Svg


def fig_req_lengths() -> str:
    """The token line of one request, before the prefill and after each of two decode steps.

    The numbers are those of examples/ch01_core.py: SmolLM2, the 5-token prompt
    "The capital of France is", max_tokens=6.
    """
    prompt = ["The", "capital", "of", "France", "is"]
    sampled = ["Paris", ".", "\\n"]
    max_len = len(prompt) + 6
    # (title, what happened to get here, cached_len, device_len)
    rows = [
        ("new request", "Req(...): cached_len=0, device_len=len(prompt)", 0, 5),
        ("after the prefill", "computed 0–4, complete_one(), sampled “Paris”", 5, 6),
        ("after decode step 1", "computed 5, complete_one(), sampled “.”", 6, 7),
        ("after decode step 2", "computed 6, complete_one(), sampled “\\n”", 7, 8),
    ]
    x0, cw, sh = 236, 56, 36  # first slot, slot pitch, slot height
    top, pitch = 58, 132
    width = x0 + max_len * cw + 150
    height = top + len(rows) * pitch + 60
    s = Svg(
        "ch01-req-lengths",
        width,
        height,
        "A request's three lengths through a prefill and two decode steps",
        "Eleven token positions: a five-token prompt and room for six output tokens. Before the "
        "prefill, cached_len is 0 and device_len is 5, so the forward pass computes positions 0 "
        "to 4. After it, complete_one moves cached_len to 5 and device_len to 6: the sampled "
        "token Paris sits at position 5 and is the only token the first decode step computes. "
        "Each decode step moves both lengths up by one. max_device_len stays at 11; remain_len "
        "counts the positions left, 6, 5, 4 and 3.",
    )
    s.text(x0 - 14, top - 30, "position", size=12.5, anchor="end", muted=True)
    for i in range(max_len):
        s.text(x0 + i * cw + (cw - 6) / 2, top - 30, str(i), size=12.5, anchor="middle", muted=True)

    def bracket(by: float, a: int, b: int, text: str, color: str | None) -> None:
        xa, xb = x0 + a * cw, x0 + b * cw - 6
        s.path(f"M{xa},{by - 4} V{by} H{xb} V{by - 4}", color=color, width=1.4, arrow_end=False)
        s.text(
            (xa + xb) / 2,
            by + 16,
            text,
            size=12.5,
            anchor="middle",
            color=color,
            muted=color is None,
        )

    for r, (title, how, cached, device) in enumerate(rows):
        y = top + r * pitch  # top of the marker labels
        sy = y + 22  # top of the slots
        s.text(16, sy + 16, title, size=15, bold=True)
        s.text(
            16,
            sy + 36,
            f"extend_len={device - cached}, remain_len={max_len - device}",
            size=12.5,
            mono=True,
            muted=True,
        )
        if r:
            s.text(16, y - 18, how, size=12.5, italic=True, muted=True)
        for i in range(max_len):
            x = x0 + i * cw
            label = prompt[i] if i < len(prompt) else sampled[i - len(prompt)] if i < device else ""
            if i < cached:
                s.box(x, sy, cw - 6, sh, CYAN, rx=5, fill_opacity=0.25, stroke_width=1.2)
            elif i < device:
                fresh = i >= len(prompt)  # a sampled token, not part of the prompt
                s.box(
                    x,
                    sy,
                    cw - 6,
                    sh,
                    GREEN if fresh else ORANGE,
                    rx=5,
                    fill_opacity=0.32,
                    stroke_width=1.8,
                )
            else:
                s.box(x, sy, cw - 6, sh, None, rx=5, dashed=True, stroke_width=1)
            if label:
                s.text(x + (cw - 6) / 2, sy + 23, label, size=12, anchor="middle", mono=True)
        # the three lengths as boundaries between positions
        for value, name, anchor, dx in [
            (cached, "cached_len", "end", -5),
            (device, "device_len", "start", 5),
        ]:
            bx = x0 + value * cw - 3
            s.line(bx, y + 4, bx, sy + sh + 6, color=None, width=2)
            s.text(
                bx + dx, y + 10, f"{name}={value}", size=12.5, anchor=anchor, mono=True, bold=True
            )
        mx = x0 + max_len * cw - 3
        s.line(mx, y + 4, mx, sy + sh + 6, color=None, width=2, dashed=True)
        s.text(mx + 6, y + 10, f"max_device_len={max_len}", size=12.5, mono=True, muted=True)
        # brackets under the slots: the part the next pass computes, and the room left
        by = sy + sh + 12
        bracket(by, cached, device, "extend", ORANGE if r == 0 else GREEN)
        if device < max_len:
            bracket(by, device, max_len, "remain", None)

    # legend
    ly = top + len(rows) * pitch - 10
    items = [
        (CYAN, False, "cached: K/V in the cache"),
        (ORANGE, False, "prompt, not yet computed"),
        (GREEN, False, "sampled, not yet computed"),
        (None, True, "room for output"),
    ]
    lx = 16
    for color, dashed, text in items:
        s.box(lx, ly, 30, 20, color, rx=4, dashed=dashed, fill_opacity=0.3, stroke_width=1.2)
        s.text(lx + 38, ly + 15, text, size=13)
        lx += 38 + len(text) * 6.9 + 30
    s.text(
        16,
        ly + 50,
        "device_len counts the sampled token at once (it is on the device); input_ids gets it "
        "later, through append_host.",
        size=13,
        muted=True,
    )
    return s.render()
