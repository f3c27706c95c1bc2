"""The life of one chat request, as a sequence diagram."""

from __future__ import annotations

from collections.abc import Sequence

from tools.figures.svg import (
    BLUE,
    FALLBACK_FG,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    TEAL,
    Svg,
    num,
    text_width,
)


def fig_request_life() -> str:
    """One chat request from the HTTP call to the freed resources."""
    names = [
        ("client", GREY),
        ("API server", BLUE),
        ("tokenizer", TEAL),
        ("detokenizer", TEAL),
        ("scheduler", ORANGE),
        ("engine", PURPLE),
    ]
    xs = [50, 172, 302, 434, 580, 740]
    C, API, TOK, DET, SCH, ENG = range(6)
    s = Svg(
        "request-life",
        800,
        0,  # set below, once the rows are laid out
        "The life of one request",
        "A sequence diagram. The client posts a chat request; the API server sends TokenizeMsg; "
        "the tokenizer sends UserMsg to the scheduler; the scheduler admits the request, runs its "
        "prefill in chunks, then one decode step per token batched with other requests; every "
        "token goes to the detokenizer as DetokenizeMsg and back to the API server as UserReply, "
        "which streams it to the client; at the end the scheduler frees the request's resources.",
    )
    head_y, head_h = 10, 42
    first = len(s.body)  # lifelines are inserted here, under everything else

    def msg(
        a: int, b: int, y: float, label: str, dashed: bool = False, detail: str | None = None
    ) -> None:
        x1, x2 = xs[a], xs[b]
        d = 1 if x2 > x1 else -1
        x1 += d * 7
        x2 -= d * 7
        s.arrow(x1, y, x2, y, dashed=dashed)
        s.label_bg((x1 + x2) / 2, y - 7, label, size=14, bold=True)
        if detail:
            s.label_bg((x1 + x2) / 2, y + 18, detail, size=12.5, muted=True)

    def note(i: int, y: float, rows: Sequence[str], color: str, width: float, side: str) -> float:
        h = 12 + 18 * len(rows)
        x = xs[i] - width - 14 if side == "left" else xs[i] + 14
        s.box(x, y, width, h, color, rx=6, fill_opacity=0.22, solid_bg=True)
        s.lines(x + 10, y + 20, rows, size=13, gap=18 / 13)
        return y + h

    def activation(i: int, y1: float, y2: float, color: str) -> None:
        s.box(xs[i] - 6, y1, 12, y2 - y1, color, rx=2, fill_opacity=0.5, solid_bg=True)

    def frame(y1: float, y2: float, tag: str, color: str, sub: str = "") -> None:
        lx1, lx2 = 8, 792
        s.box(lx1, y1, lx2 - lx1, y2 - y1, None, rx=8, stroke_width=1.2)
        tw = text_width(tag, 13.5, bold=True) * 1.12 + 22
        s.body.append(
            f'<path d="M{lx1},{num(y1 + 8)} a8,8 0 0 1 8,-8 H{num(lx1 + tw)} v18 l-9,9 H{lx1} z" '
            f'fill="{color}" fill-opacity="0.28" stroke="{color}" stroke-width="1.2"/>'
        )
        s.text(lx1 + 9, y1 + 19, tag, size=13.5, bold=True)
        if sub:
            s.label_bg(lx1 + 10, y1 + 47, sub, size=13, anchor="start", muted=True)

    y = 92
    msg(C, API, y, "HTTP POST", detail="/v1/chat/completions")
    y += 52
    msg(API, TOK, y, "TokenizeMsg", detail="uid, messages")
    y += 34
    note(TOK, y, ["chat template,", "encode → int32 ids"], TEAL, width=150, side="right")
    y += 84
    msg(TOK, SCH, y, "UserMsg", detail="uid, input_ids, SamplingParams")
    y += 36
    note(
        SCH,
        y,
        [
            "admission (PrefillAdder):",
            "· reuse the longest prefix",
            "  found in the radix cache",
            "· reserve room for the rest",
            "  of the prompt + max_tokens",
            "· take a page-table row",
        ],
        ORANGE,
        width=224,
        side="left",
    )
    y += 140

    # prefill, in chunks
    top = y
    y += 64
    msg(SCH, ENG, y, "prefill chunk 1")
    y += 30
    msg(ENG, SCH, y, "no token yet", dashed=True)
    y += 42
    msg(SCH, ENG, y, "last chunk")
    y += 30
    msg(ENG, SCH, y, "token 1", dashed=True)
    activation(ENG, top + 54, y + 5, PURPLE)
    y += 20
    frame(top, y, "prefill", ORANGE, "long prompts run in chunks of max_extend_tokens")
    y += 42
    msg(SCH, DET, y, "DetokenizeMsg", detail="uid, next_token, finished")
    y += 50
    msg(DET, API, y, "UserReply", detail="uid, incremental_output, finished")
    y += 50
    msg(API, C, y, "data: text")
    y += 30

    # decode loop
    top = y
    y += 68
    msg(SCH, ENG, y, "decode step")
    y += 30
    msg(ENG, SCH, y, "token k", dashed=True)
    activation(ENG, top + 58, y + 5, PURPLE)
    y += 40
    msg(SCH, DET, y, "DetokenizeMsg")
    y += 38
    msg(DET, API, y, "UserReply")
    y += 38
    msg(API, C, y, "data: text")
    y += 18
    frame(top, y, "loop: decode", GREEN, "one token per step; all running requests share the step")
    y += 46

    # finish
    msg(ENG, SCH, y, "EOS or max_tokens", dashed=True)
    y += 40
    msg(SCH, DET, y, "DetokenizeMsg", detail="finished=True")
    y += 50
    msg(DET, API, y, "UserReply", detail="finished=True")
    y += 50
    msg(API, C, y, "data: [DONE]")
    y += 24
    y = note(
        SCH,
        y,
        [
            "free: give the page-table row",
            "back; insert the tokens into the",
            "radix cache; free the pages it",
            "did not keep",
        ],
        ORANGE,
        width=250,
        side="left",
    )
    end_y = y + 14

    # lifelines under everything, heads on top of everything
    under: list[str] = []
    for x in xs:
        under.append(
            f'<path d="M{num(x)},{head_y + head_h} L{num(x)},{num(end_y)}" fill="none" '
            f'class="fg-stroke" stroke="{FALLBACK_FG}" stroke-opacity="0.4" stroke-width="1.2" '
            f'stroke-dasharray="5 4"/>'
        )
    s.body[first:first] = under
    for (label, color), x in zip(names, xs, strict=True):
        w = max(92, text_width(label, 15, bold=True) + 24)
        s.box(x - w / 2, head_y, w, head_h, color, solid_bg=True)
        s.text(x, head_y + 27, label, size=15, anchor="middle", bold=True)
    s.height = end_y + 8
    return s.render()
