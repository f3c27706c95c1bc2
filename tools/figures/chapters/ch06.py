"""Figures of chapter 06 (engine and sampling).

ch06-engine      what Engine.__init__ builds, in order, and one forward_batch call
ch06-top-k-top-p the sampler's filters on one sorted distribution
"""

from __future__ import annotations

import math

from tools.figures.svg import CYAN, GREEN, GREY, ORANGE, PURPLE, RED, TEAL, Svg


def fig_engine() -> str:
    s = Svg(
        "ch06-engine",
        940,
        580,
        "The engine's parts and one forward_batch call",
        "Left: what Engine.__init__ builds, in order: the TP info and the attention backend "
        "choice, the device and its stream, the Context, the model on the meta device filled "
        "with its weights, the KV pool with one extra page, the page table with one extra row, "
        "the attention backend, the sampler and the dummy request. Right: forward_batch runs the "
        "model inside ctx.forward_batch, advances every request with complete_one, samples one "
        "token per request, starts a copy of the tokens to the host and records an event.",
    )
    s.text(20, 28, "Engine.__init__, in order", size=16, bold=True)
    items = [
        ("set_tp_info(0, 1); _adjust_config", '"auto" -> "torch"', GREY),
        ("device, Stream, manual_seed(42)", "cuda:rank, or the CPU", GREY),
        ("Context(page_size) -> set_global_ctx", "what the layers read", GREY),
        (
            "model: built on meta, then load_state_dict",
            "weights from safetensors (or dummy)",
            PURPLE,
        ),
        ("KV pool: num_pages + 1 pages", "sized from free memory; +1: dummy page", CYAN),
        ("page table: (max_running_req + 1) x align32", "token slots, int32; +1: dummy row", CYAN),
        ("attention backend", "create_attention_backend(name, config)", ORANGE),
        ("Sampler(device, vocab_size)", "greedy, temperature, top-k, top-p", GREEN),
        ("dummy_req", "its page-table row -> the dummy page", GREY),
    ]
    y = 44
    for i, (title, sub, color) in enumerate(items):
        s.box(20, y, 400, 46, color, rx=8)
        s.text(36, y + 20, f"{i + 1}", size=13, bold=True, muted=True)
        s.text(56, y + 20, title, size=13.5, bold=True, mono=True)
        s.text(56, y + 38, sub, size=12.5, muted=True)
        y += 54

    # forward_batch
    x0 = 480
    s.text(x0, 28, "forward_batch(batch, args)", size=16, bold=True, mono=True)
    s.box(x0, 44, 440, 56, None, rx=8, dashed=True, stroke_width=1.2)
    s.lines(
        x0 + 14,
        66,
        ["from the caller: a Batch whose attn_metadata is ready,", "args = sampler.prepare(batch)"],
        size=12.5,
        muted=True,
    )
    steps = [
        (
            "with ctx.forward_batch(batch):",
            "    logits = model.forward()",
            "[bs, vocab]: last token of each request",
            PURPLE,
        ),
        (
            "for req in batch.reqs:",
            "    req.complete_one()",
            "cached_len = device_len; device_len += 1",
            TEAL,
        ),
        (
            "sampler.sample(logits[:bs], args)",
            "    .to(torch.int32)",
            "next_tokens_gpu [bs]",
            GREEN,
        ),
        (
            'next_tokens_gpu.to("cpu", non_blocking)',
            "copy_done_event.record(stream)",
            "next_tokens_cpu: valid after the event",
            CYAN,
        ),
    ]
    y = 118
    for a, b, note, color in steps:
        s.arrow(x0 + 220, y - 16, x0 + 220, y - 2)
        s.box(x0, y, 440, 78, color, rx=8)
        s.text(x0 + 14, y + 22, a, size=13, mono=True, bold=True)
        s.text(x0 + 14, y + 42, b, size=13, mono=True, bold=True)
        s.text(x0 + 14, y + 64, note, size=12.5, muted=True)
        y += 96
    s.arrow(x0 + 220, y - 16, x0 + 220, y - 2)
    s.box(x0, y, 440, 40, None, rx=8)
    s.text(
        x0 + 220,
        y + 25,
        "ForwardOutput(gpu, cpu, copy_done_event)",
        size=13,
        anchor="middle",
        mono=True,
        bold=True,
    )
    # which parts forward_batch uses
    s.path(
        f"M422,{44 + 3 * 54 + 23} C455,{44 + 3 * 54 + 23} 450,{118 + 39} {x0 - 2},{118 + 39}",
        color=PURPLE,
        dashed=True,
        width=1.3,
    )
    s.path(
        f"M422,{44 + 7 * 54 + 23} C455,{44 + 7 * 54 + 23} 450,{118 + 2 * 96 + 39} "
        f"{x0 - 2},{118 + 2 * 96 + 39}",
        color=GREEN,
        dashed=True,
        width=1.3,
    )
    s.text(
        20,
        570,
        "The pool, the page table and the backend are reached through the Context during "
        "model.forward().",
        size=12.5,
        muted=True,
    )
    return s.render()


# An illustrative distribution: ten logits at temperature 1, top_k = 5, top_p = 0.8.
LOGITS = [2.0, 1.6, 1.3, 1.0, 0.6, 0.3, 0.0, -0.4, -0.8, -1.2]
TOP_K, TOP_P = 5, 0.8


def _filters() -> tuple[list[float], list[float], list[float], list[float]]:
    e = [math.exp(x) for x in LOGITS]
    probs = [x / sum(e) for x in e]
    kept = [p if i < TOP_K else 0.0 for i, p in enumerate(probs)]
    renorm = [p / sum(kept) for p in kept]
    before: list[float] = []
    acc = 0.0
    for p in renorm:
        before.append(acc)
        acc += p
    nucleus = [p if b < TOP_P else 0.0 for p, b in zip(renorm, before, strict=True)]
    return probs, renorm, before, nucleus


def fig_top_k_top_p() -> str:
    probs, renorm, before, nucleus = _filters()
    s = Svg(
        "ch06-top-k-top-p",
        940,
        330,
        "Top-k, then top-p, on a sorted distribution",
        f"Three bar charts of the same ten tokens, sorted by probability. Left: the softmax of "
        f"the logits. Middle: top_k = {TOP_K} drops every rank from {TOP_K} on and renormalises "
        f"the rest. Right: top_p = {TOP_P} keeps a token while the probability mass of the "
        f"tokens before it is below {TOP_P}; here {sum(1 for p in nucleus if p)} tokens stay, "
        f"and the draw is in proportion to them.",
    )
    panels = [
        ("softmax(logits / T), sorted", probs, [True] * len(probs), None),
        (f"top_k = {TOP_K}: renormalised", renorm, [p > 0 for p in renorm], None),
        (f"top_p = {TOP_P}: mass before < {TOP_P}", nucleus, [p > 0 for p in nucleus], before),
    ]
    top = max(max(p) for _, p, _, _ in panels)
    base, height, bw = 250, 170, 24
    for k, (title, values, keep, notes) in enumerate(panels):
        px = 20 + k * 310
        s.text(px, 30, title, size=14, bold=True)
        s.line(px, base, px + 10 * (bw + 4), base, color=None, width=1)
        for i, v in enumerate(values):
            x = px + i * (bw + 4)
            shown = v if keep[i] else (probs[i] if k == 1 else renorm[i])
            h = max(shown / top * height, 1)
            if keep[i]:
                s.box(
                    x,
                    base - h,
                    bw,
                    h,
                    GREEN if k else GREY,
                    rx=2,
                    fill_opacity=0.45,
                    stroke_width=1,
                )
                s.text(x + bw / 2, base - h - 5, f"{v:.2f}".lstrip("0"), size=10.5, anchor="middle")
            else:
                s.box(x, base - h, bw, h, None, rx=2, dashed=True, stroke_width=0.8)
            s.text(x + bw / 2, base + 15, str(i), size=11, anchor="middle", muted=True)
        if notes is not None:
            s.text(px - 2, base + 36, "before:", size=11, muted=True)
            for i in range(TOP_K):
                x = px + i * (bw + 4) + bw / 2
                s.text(
                    x,
                    base + 52,
                    f"{notes[i]:.2f}",
                    size=10.5,
                    anchor="middle",
                    color=GREEN if notes[i] < TOP_P else RED,
                )
        if k < 2:
            s.arrow(px + 10 * (bw + 4) + 4, 150, px + 10 * (bw + 4) + 24, 150)
    s.text(20, base + 52, "rank (sorted by probability)", size=11.5, muted=True)
    s.text(
        20,
        320,
        "Dashed: dropped. The most likely token is always kept (the mass before it is 0); "
        "torch.multinomial draws in proportion to what is left.",
        size=12.5,
        muted=True,
    )
    return s.render()
