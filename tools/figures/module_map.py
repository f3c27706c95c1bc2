"""The module map: the packages of minisgl in dependency layers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Dict

from tools.book import tomllib
from tools.figures.svg import (
    AMBER,
    BLUE,
    CYAN,
    FALLBACK_MUTED,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    TEAL,
    Svg,
    esc,
    num,
)

ROOT = Path(__file__).resolve().parents[2]

MODULES: list[tuple[str, list[tuple[str, str, str, str]], Sequence[str]]] = [
    # band title ("|" breaks the line), [(package, one line, chapter, colour)], a note
    (
        "entry|points",
        [
            ("server", "HTTP API, launch", "15", BLUE),
            ("tokenizer", "text ⇄ token ids", "13", TEAL),
            ("llm", "offline generate", "11", BLUE),
            ("benchmark", "load, timing", "21", GREY),
        ],
        (),
    ),
    (
        "scheduling",
        [
            ("scheduler", "batches, admission", "07", ORANGE),
            ("message", "between processes", "12", AMBER),
        ],
        (
            "one Scheduler per GPU: the Engine,",
            "the request slots, the page",
            "allocator, the prefix cache",
        ),
    ),
    (
        "one GPU",
        [
            ("engine", "forward, sample", "06", PURPLE),
        ],
        (
            "one Engine per GPU: the model, the KV pool,",
            "the page table, the attention backend,",
            "the sampler, the CUDA graphs",
        ),
    ),
    (
        "memory",
        [
            ("kvcache", "KV pool, prefixes", "04", GREEN),
            ("attention", "paged backends", "05", GREEN),
        ],
        ("the KV memory, and the attention", "that reads it page by page"),
    ),
    (
        "model",
        [
            ("layers", "ops, TP linears", "02", CYAN),
            ("models", "decoders, weights", "03", CYAN),
            ("moe", "experts, routing", "20", CYAN),
        ],
        ("the transformer,", "as plain ops"),
    ),
    (
        "foundations",
        [
            ("core", "Req, Batch, Context", "01", GREY),
            ("utils", "logger, registry", "01", GREY),
            ("distributed", "all-reduce", "16", GREY),
            ("kernel", "CUDA, Triton", "19", GREY),
        ],
        (),
    ),
]


def written_chapters() -> Dict[str, str]:
    """Chapter number ("09") -> its page under the site's root ("chapters/ch09-radix"), for
    the chapters that have a page."""
    pages = {}
    for manifest in sorted((ROOT / "chapters").glob("ch*/manifest.toml")):
        page = tomllib.loads(manifest.read_text()).get("page")
        if page:
            pages[manifest.parent.name.removeprefix("ch")] = page.removeprefix(
                "docs/"
            ).removesuffix(".md")
    return pages


def fig_module_map() -> str:
    """The packages of minisgl in dependency layers, with the chapter that builds each."""
    width = 800
    band_h, gap, left = 84, 12, 6
    height = 14 + len(MODULES) * (band_h + gap) + 28
    s = Svg(
        "module-map",
        width,
        height,
        "The module map of minisgl",
        "The packages of minisgl in six layers. Top: server, tokenizer, llm, benchmark. Then "
        "scheduler and message. Then engine. Then kvcache and attention. Then layers, models "
        "and moe. At the bottom: core, utils, distributed and kernel. A package imports only "
        "from its own layer or the layers below it. Each box shows the chapter that builds it.",
    )
    y = 14
    inner_left, inner_right = left + 106, width - 44
    step = (inner_right - inner_left) / 4
    for band, mods, note in MODULES:
        s.box(left, y, inner_right + 6 - left, band_h, None, rx=12, stroke_width=1)
        parts = band.split("|")
        s.lines(
            left + 12,
            y + band_h / 2 + 5 - 8.5 * (len(parts) - 1),
            parts,
            size=13.5,
            bold=True,
            muted=True,
            gap=1.25,
        )
        n = len(mods)
        start = inner_left if note else inner_left + ((inner_right - inner_left) - n * step) / 2
        for i, (pkg, line, chapter, color) in enumerate(mods):
            bx, by, bw, bh = start + i * step + 4, y + 10, step - 8, band_h - 20
            s.box(bx, by, bw, bh, color, rx=9)
            s.text(bx + 10, by + 26, pkg, size=15.5, bold=True, mono=True)
            s.text(bx + 10, by + 50, line, size=13, muted=True)
            page = written_chapters().get(chapter)
            if page is not None:  # a written chapter's badge links to its page
                s.body.append(f'<a href="../{page}/">')
            s.pill(bx + bw - 7, by + 16, chapter, color, size=12, anchor="end")
            if page is not None:
                s.body.append("</a>")
        if note:
            nx = start + n * step + 10
            s.lines(
                nx, y + band_h / 2 + 5 - 9 * (len(note) - 1), note, size=13, muted=True, gap=1.38
            )
        y += band_h + gap
    # the "imports" arrow on the right
    ax = width - 22
    s.arrow(ax, 22, ax, y - gap - 8, width=1.8)
    mid = (14 + y - gap) / 2
    s.body.append(
        f'<text x="{ax + 13}" y="{num(mid)}" font-size="13" text-anchor="middle" '
        f'transform="rotate(90 {ax + 13} {num(mid)})" class="muted" fill="{FALLBACK_MUTED}">'
        f"{esc('imports only from its own layer or below')}</text>"
    )
    s.text(
        left,
        y + 12,
        "The badge is the chapter that builds the package; later chapters add files to several.",
        size=13,
        muted=True,
    )
    return s.render()
