"""Figures of chapter 10 (chunked prefill).

ch10-timeline  the main's steps: r2's 86-token prompt in chunks of at most 32, taking turns
               with r0's and r1's decode steps; below, the same requests in upstream's order
               (prefill first), where r0 and r1 wait for the whole prompt
ch10-chunks    the same prompt cut into chunks: what each chunk computes, what it reads from
               the KV cache, and which kind of request carries it
"""

from __future__ import annotations

from tools.figures.svg import CYAN, GREEN, ORANGE, RED, Svg

# The trace that examples/ch10_chunked.py::show_chunks prints: per step, each request's part.
# "c" is a chunk of a ChunkedReq (samples nothing), "p" a prefill that samples the first
# token, "d" a decode step.
OURS = [
    {"r0": ("p", 5), "r1": ("p", 3)},
    {"r0": ("d", 1), "r1": ("d", 1)},
    {"r2": ("c", 32)},
    {"r0": ("d", 1), "r1": ("d", 1)},
    {"r2": ("c", 32)},
    {"r0": ("d", 1), "r1": ("d", 1)},
    {"r2": ("p", 22)},
    *[{"r0": ("d", 1), "r1": ("d", 1), "r2": ("d", 1)}] * 5,
    *[{"r0": ("d", 1), "r1": ("d", 1)}] * 3,
]
# The same arrivals when prefill always goes first (upstream's _schedule_next_batch): r2's
# chunks run back to back, r0 and r1 need the same 11 decode steps after it.
UPSTREAM = [
    {"r0": ("p", 5), "r1": ("p", 3)},
    {"r0": ("d", 1), "r1": ("d", 1)},
    {"r2": ("c", 32)},
    {"r2": ("c", 32)},
    {"r2": ("p", 22)},
    *[{"r0": ("d", 1), "r1": ("d", 1), "r2": ("d", 1)}] * 5,
    *[{"r0": ("d", 1), "r1": ("d", 1)}] * 5,
]

PROMPT, BUDGET = 86, 32  # r2's prompt and the main's max_extend_tokens


def fig_timeline() -> str:
    s = Svg(
        "ch10-timeline",
        940,
        440,
        "Chunks of a long prompt taking turns with decode steps",
        "Fifteen steps of the chapter's main. r0 and r1 are prefilled at step 0 and decode. r2 "
        "arrives at step 2 with an 86-token prompt; the budget is 32 tokens per prefill batch, "
        "so its prompt runs in chunks of 32, 32 and 22 at steps 2, 4 and 6, and r0 and r1 decode "
        "at steps 3 and 5 in between. Below, the same requests when prefill always goes first, "
        "as upstream schedules: r2's chunks run at steps 2, 3 and 4, and r0 and r1 produce no "
        "token from step 2 to step 4.",
    )
    x0, cw, rh = 128, 52, 34
    s.text(20, 26, "step", size=13, muted=True)
    for t in range(len(OURS)):
        s.text(x0 + t * cw + cw / 2, 26, str(t), size=13, anchor="middle", muted=True)

    def group(
        y: float,
        title: str,
        steps: list[dict[str, tuple[str, int]]],
        waits: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        s.text(20, y, title, size=14, bold=True)
        for r, req in enumerate(["r0", "r1", "r2"]):
            ry = y + 12 + r * (rh + 6)
            s.text(20, ry + rh / 2 + 5, req, size=13.5, bold=True)
            for t, step in enumerate(steps):
                if req not in step:
                    continue
                kind, n = step[req]
                x = x0 + t * cw + 3
                w = cw - 6
                if kind == "d":
                    s.box(x, ry + 5, w, rh - 10, GREEN, rx=5, fill_opacity=0.35, stroke_width=1.1)
                else:
                    s.box(
                        x,
                        ry,
                        w,
                        rh,
                        ORANGE,
                        rx=5,
                        fill_opacity=0.3 if kind == "p" else 0.12,
                        dashed=kind == "c",
                        stroke_width=1.3,
                    )
                    s.text(x + w / 2, ry + rh / 2 + 5, str(n), size=13, anchor="middle", bold=True)
            if waits and req in waits:
                a, b = waits[req]
                s.box(
                    x0 + a * cw + 3,
                    ry + 3,
                    (b - a + 1) * cw - 6,
                    rh - 6,
                    RED,
                    rx=5,
                    fill_opacity=0.06,
                    dashed=True,
                    stroke_width=1.1,
                )
                s.text(
                    x0 + (a + b + 1) * cw / 2,
                    ry + rh / 2 + 5,
                    "no token",
                    size=12,
                    anchor="middle",
                    color=RED,
                )

    group(64, "this chapter: after a chunk, the running requests decode once", OURS)
    group(
        228,
        "prefill first (upstream's order): the chunks run back to back",
        UPSTREAM,
        waits={"r0": (2, 4), "r1": (2, 4)},
    )

    ly = 394
    s.box(20, ly - 15, 30, 20, ORANGE, rx=4, fill_opacity=0.12, dashed=True, stroke_width=1.2)
    s.text(58, ly, "chunk of a ChunkedReq: writes K/V, samples nothing", size=12.5)
    s.box(470, ly - 15, 30, 20, ORANGE, rx=4, fill_opacity=0.3, stroke_width=1.2)
    s.text(508, ly, "prefill that samples the first token", size=12.5)
    s.box(20, ly + 15, 30, 14, GREEN, rx=4, fill_opacity=0.35, stroke_width=1.1)
    s.text(58, ly + 27, "decode step: one token", size=12.5)
    s.text(470, ly + 27, "numbers: prompt tokens computed in that step", size=12.5, muted=True)
    return s.render()


def fig_chunks() -> str:
    s = Svg(
        "ch10-chunks",
        940,
        352,
        "An 86-token prompt prefilled in three chunks",
        "With a budget of 32 tokens, r2's 86-token prompt is prefilled as positions 0 to 31, 32 "
        "to 63 and 64 to 85. Each chunk writes its keys and values into the KV cache and attends "
        "to everything before it: the earlier chunks through the cache, its own tokens causally. "
        "The first two chunks are ChunkedReqs, whose sampled token is thrown away; the last is an "
        "ordinary Req, whose sample is the first output token. Its positions continue where the "
        "cache ends, so the result is the same as one prefill of the whole prompt.",
    )
    x0, scale = 40, 9.2  # pixels per token
    s.text(
        20, 26, f"r2's prompt: {PROMPT} tokens; max_extend_tokens = {BUDGET}", size=15, bold=True
    )
    chunks = []
    start = 0
    while start < PROMPT:
        n = min(BUDGET, PROMPT - start)
        chunks.append((start, n))
        start += n
    for i, (start, n) in enumerate(chunks):
        y = 54 + i * 88
        last = start + n == PROMPT
        s.text(20, y + 20, f"step {2 + 2 * i}", size=12.5, muted=True)
        bx = x0 + 60
        if start:
            s.box(bx, y, start * scale, 30, CYAN, rx=5, fill_opacity=0.3, stroke_width=1.2)
            s.text(
                bx + start * scale / 2,
                y + 20,
                f"0-{start - 1}: in the cache, read",
                size=12.5,
                anchor="middle",
            )
        cx = bx + start * scale
        s.box(
            cx, y, n * scale, 30, ORANGE, rx=5, fill_opacity=0.3, dashed=not last, stroke_width=1.3
        )
        s.text(
            cx + n * scale / 2,
            y + 20,
            f"{start}-{start + n - 1}: computed",
            size=12.5,
            anchor="middle",
            bold=True,
        )
        rest = PROMPT - start - n
        if rest:
            rx = cx + n * scale
            s.box(rx, y, rest * scale, 30, None, rx=5, dashed=True, stroke_width=1)
            s.text(rx + rest * scale / 2, y + 20, "not yet", size=12.5, anchor="middle", muted=True)
        kind = "Req" if last else "ChunkedReq"
        detail = (
            f"cached_len {start}, input_ids[:{start + n}]; its sample is r2's first token"
            if last
            else f"cached_len {start}, input_ids[:{start + n}]; its sample is thrown away"
        )
        s.text(bx, y + 50, kind, size=12.5, mono=True, bold=True, color=ORANGE)
        s.text(bx + (40 if last else 90), y + 50, detail, size=12.5, muted=True)
    ay = 54 + len(chunks) * 88 - 4
    s.text(
        20,
        ay,
        "A query at position p sees keys 0 .. p: the earlier chunks' keys come from the cache, "
        "the chunk's own",
        size=13,
    )
    s.text(
        20,
        ay + 20,
        "keys from this pass. Positions continue at cached_len, so every token gets "
        "the same RoPE as in one prefill.",
        size=13,
    )
    return s.render()
