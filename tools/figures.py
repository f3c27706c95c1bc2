"""Draw the handbook's figures as SVG, with the standard library only.

Each figure is one function that returns the text of an SVG document. The
functions are listed in ``FIGURES``; ``generate(out_dir)`` writes every figure
to ``out_dir/<name>.svg`` and ``main()`` does that for ``docs/figures/``.
``tools/mkdocs_hooks.py`` calls ``generate`` before every ``mkdocs build``, so
the figures are never committed.

The pages include a figure inline, inside ``<div class="book-figure" markdown>``.
Two consequences shape the code below:

* Colours that must follow the light or dark theme are CSS classes that
  ``docs/stylesheets/extra.css`` defines inside ``.book-figure``: ``fg`` (fill in
  the text colour), ``fg-stroke`` (stroke in the text colour), ``muted`` (lighter
  text) and ``bg`` (page background). Every such element also carries a plain
  presentation attribute as a fallback, so the file still reads when opened on
  its own; inside the page the CSS class wins. Box fills are medium-saturation
  hues at low opacity, which read on both backgrounds.
* Python-Markdown treats an inline ``<svg>`` as a paragraph of inline HTML, so
  text between tags goes through Markdown's inline rules. ``_esc`` writes every
  character that Markdown, attr_list or arithmatex would act on as a numeric
  character reference, and the document has no blank lines and no indentation.

Run ``python tools/figures.py`` (optionally with an output folder, or with
figure names to write only those).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "figures"
if str(ROOT) not in sys.path:  # the chapter figure modules import tools.figures
    sys.path.insert(0, str(ROOT))

FONT = "Roboto, 'Helvetica Neue', Helvetica, Arial, sans-serif"
MONO = "'Roboto Mono', SFMono-Regular, Menlo, Consolas, monospace"

# Fallback colours for a file opened outside the page (light background).
FALLBACK_FG = "#1f2328"
FALLBACK_MUTED = "#6e7781"
FALLBACK_BG = "#ffffff"

# One hue per kind of thing. Medium saturation, so that the same hue works as a
# translucent fill and as a stroke on white and on the dark slate background.
BLUE = "#5c6bc0"  # API server, front ends
TEAL = "#26a69a"  # tokenizer and detokenizer
ORANGE = "#f57c00"  # scheduler, prefill
PURPLE = "#ab47bc"  # engine, GPU work
GREEN = "#43a047"  # decode, finished
GREY = "#78909c"  # clients, external things
RED = "#e53935"  # idle time, problems
AMBER = "#f9a825"  # messages
CYAN = "#039be5"  # memory, caches

FILL_OPACITY = 0.18

# Characters that Markdown (emphasis, code, links, escapes), attr_list ({...})
# and arithmatex ($...$) would act on inside the page.
_MD_SPECIAL = {
    "_": "&#95;",
    "*": "&#42;",
    "`": "&#96;",
    "[": "&#91;",
    "]": "&#93;",
    "\\": "&#92;",
    "{": "&#123;",
    "}": "&#125;",
    "$": "&#36;",
    "|": "&#124;",
    "~": "&#126;",
    "^": "&#94;",
    "=": "&#61;",
}


def _esc(text: str) -> str:
    """Escape text content for XML and make it inert for Markdown."""
    out = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "".join(_MD_SPECIAL.get(ch, ch) for ch in out)


def _num(v: float) -> str:
    """Format a coordinate: integers without a decimal point, others rounded."""
    if abs(v - round(v)) < 1e-6:
        return str(round(v))
    return f"{v:.2f}".rstrip("0").rstrip(".")


def text_width(text: str, size: float, mono: bool = False, bold: bool = False) -> float:
    """A rough width estimate, good enough to size label backgrounds and boxes."""
    if mono:
        return 0.6 * size * len(text)
    narrow = sum(ch in "iljtfrI.,:;'!|() " for ch in text)
    wide = sum(ch in "mwMW@" for ch in text)
    caps = sum(ch.isupper() for ch in text)
    n = len(text) - narrow - wide
    w = size * (0.53 * n + 0.3 * narrow + 0.8 * wide + 0.1 * caps)
    return w * (1.06 if bold else 1.0)


class Svg:
    """A tiny SVG builder: shapes and text in user units, rendered without blank lines."""

    def __init__(self, name: str, width: float, height: float, title: str, desc: str) -> None:
        self.name = name
        self.width = width
        self.height = height
        self.title = title
        self.desc = desc
        self.defs: list[str] = []
        self.body: list[str] = []
        self._markers: dict[str, str] = {}

    # ----------------------------------------------------------------- markers
    def marker(self, color: str | None = None, start: bool = False) -> str:
        """Id of an arrowhead marker; None means the theme's text colour."""
        key = f"{color or 'fg'}-{'s' if start else 'e'}"
        if key not in self._markers:
            mid = f"{self.name}-arrow-{len(self._markers)}"
            path = "M10,0 L0,5 L10,10 z" if start else "M0,0 L10,5 L0,10 z"
            ref = 0 if start else 10
            if color is None:
                paint = f'class="fg" fill="{FALLBACK_FG}"'
            else:
                paint = f'fill="{color}"'
            self.defs.append(
                f'<marker id="{mid}" viewBox="0 0 10 10" refX="{ref}" refY="5" '
                f'markerWidth="6" markerHeight="6" orient="auto">'
                f'<path d="{path}" {paint}/></marker>'
            )
            self._markers[key] = mid
        return self._markers[key]

    # ------------------------------------------------------------------ shapes
    def box(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        color: str | None = None,
        rx: float = 10,
        dashed: bool = False,
        fill_opacity: float = FILL_OPACITY,
        stroke_width: float = 1.6,
        solid_bg: bool = False,
    ) -> None:
        """A rounded box: a translucent hue fill and a stroke of the same hue.

        With ``color=None`` the box has no fill and a stroke in the text colour.
        ``solid_bg`` first paints the page background, so the box hides lines
        drawn under it.
        """
        geo = f'x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" rx="{_num(rx)}"'
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        if solid_bg:
            self.body.append(f'<rect {geo} class="bg" fill="{FALLBACK_BG}"/>')
        if color is None:
            self.body.append(
                f'<rect {geo} fill="none" class="fg-stroke" stroke="{FALLBACK_FG}" '
                f'stroke-opacity="0.55" stroke-width="{_num(stroke_width)}"{dash}/>'
            )
        else:
            self.body.append(
                f'<rect {geo} fill="{color}" fill-opacity="{_num(fill_opacity)}" '
                f'stroke="{color}" stroke-width="{_num(stroke_width)}"{dash}/>'
            )

    def text(
        self,
        x: float,
        y: float,
        s: str,
        size: float = 14,
        anchor: str = "start",
        bold: bool = False,
        mono: bool = False,
        muted: bool = False,
        italic: bool = False,
        color: str | None = None,
    ) -> None:
        """One line of text; ``y`` is the baseline. Leading spaces are kept (as no-break spaces)."""
        stripped = s.lstrip(" ")
        s = "\u00a0" * (len(s) - len(stripped)) + stripped
        attrs = [f'x="{_num(x)}" y="{_num(y)}"', f'font-size="{_num(size)}"']
        if anchor != "start":
            attrs.append(f'text-anchor="{anchor}"')
        if bold:
            attrs.append('font-weight="600"')
        if italic:
            attrs.append('font-style="italic"')
        if mono:
            attrs.append(f'font-family="{MONO}"')
        if color is not None:
            attrs.append(f'fill="{color}"')
        elif muted:
            attrs.append(f'class="muted" fill="{FALLBACK_MUTED}"')
        else:
            attrs.append(f'class="fg" fill="{FALLBACK_FG}"')
        self.body.append(f"<text {' '.join(attrs)}>{_esc(s)}</text>")

    def lines(
        self,
        x: float,
        y: float,
        rows: Sequence[str],
        size: float = 14,
        gap: float = 1.35,
        **kw,
    ) -> float:
        """Several lines of text from baseline ``y``; returns the next baseline."""
        for row in rows:
            self.text(x, y, row, size=size, **kw)
            y += size * gap
        return y

    def path(
        self,
        d: str,
        color: str | None = None,
        width: float = 1.6,
        dashed: bool = False,
        arrow_end: bool = True,
        arrow_start: bool = False,
        opacity: float | None = None,
    ) -> None:
        """A stroked path, optionally with arrowheads; ``color=None`` is the text colour."""
        attrs = [f'd="{d}"', 'fill="none"', f'stroke-width="{_num(width)}"']
        if color is None:
            attrs.append(f'class="fg-stroke" stroke="{FALLBACK_FG}"')
        else:
            attrs.append(f'stroke="{color}"')
        if opacity is not None:
            attrs.append(f'stroke-opacity="{_num(opacity)}"')
        if dashed:
            attrs.append('stroke-dasharray="5 4"')
        if arrow_end:
            attrs.append(f'marker-end="url(#{self.marker(color)})"')
        if arrow_start:
            attrs.append(f'marker-start="url(#{self.marker(color, start=True)})"')
        self.body.append(f"<path {' '.join(attrs)}/>")

    def arrow(self, x1: float, y1: float, x2: float, y2: float, **kw) -> None:
        """A straight arrow from (x1, y1) to (x2, y2)."""
        self.path(f"M{_num(x1)},{_num(y1)} L{_num(x2)},{_num(y2)}", **kw)

    def line(self, x1: float, y1: float, x2: float, y2: float, **kw) -> None:
        """A straight line without arrowheads."""
        kw.setdefault("arrow_end", False)
        self.path(f"M{_num(x1)},{_num(y1)} L{_num(x2)},{_num(y2)}", **kw)

    def pill(
        self, x: float, y: float, s: str, color: str, size: float = 12, anchor: str = "start"
    ) -> float:
        """A small rounded label (a chapter badge); ``y`` is its vertical centre. Returns its width."""
        w = text_width(s, size, bold=True) + 14
        h = size + 8
        left = x if anchor == "start" else (x - w if anchor == "end" else x - w / 2)
        self.box(left, y - h / 2, w, h, color, rx=h / 2, fill_opacity=0.3, stroke_width=1.2)
        self.text(left + w / 2, y + size * 0.35, s, size=size, anchor="middle", bold=True)
        return w

    def label_bg(
        self,
        x: float,
        y: float,
        s: str,
        size: float = 13,
        anchor: str = "middle",
        pad: float = 4,
        **kw,
    ) -> None:
        """Text on a patch of page background, to sit on top of a line."""
        w = text_width(s, size, mono=kw.get("mono", False), bold=kw.get("bold", False)) + 2 * pad
        left = x - w / 2 if anchor == "middle" else (x - w if anchor == "end" else x)
        self.body.append(
            f'<rect x="{_num(left)}" y="{_num(y - size * 0.95)}" width="{_num(w)}" '
            f'height="{_num(size * 1.3)}" rx="3" class="bg" fill="{FALLBACK_BG}"/>'
        )
        self.text(x, y, s, size=size, anchor=anchor, **kw)

    # ------------------------------------------------------------------ output
    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_num(self.width)} {_num(self.height)}" '
            f'role="img" aria-labelledby="{self.name}-title {self.name}-desc" '
            f'font-family="{FONT}" class="book-svg book-svg-{self.name}">'
        )
        out = [head]
        out.append(f'<title id="{self.name}-title">{_esc(self.title)}</title>')
        out.append(f'<desc id="{self.name}-desc">{_esc(self.desc)}</desc>')
        if self.defs:
            out.append("<defs>")
            out.extend(self.defs)
            out.append("</defs>")
        out.extend(self.body)
        out.append("</svg>")
        text = "\n".join(out) + "\n"
        # Markdown reads the inline SVG line by line: a blank line would end the paragraph and
        # an indented line could start a code block, so every line must open with a tag.
        assert all(line.startswith("<") for line in text.splitlines()), self.name
        return text


# =============================================================================
# Figure: the decode loop of step 0
# =============================================================================


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
        f"M{_num(mx1 + 95)},{y1 + 64} V{y1 + 94} H{_num(wx)} V{ky - 2}",
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
        f"M{_num(right)},{y2 + 32} H{_num(right + 30)} V{y2 + 96} H{_num(16 + tok_w / 2)} V{y2 + 80}",
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


# =============================================================================
# Figure: processes and the messages between them
# =============================================================================


def fig_processes() -> str:
    """The processes of a running server and the ZMQ messages between them."""
    s = Svg(
        "processes",
        800,
        650,
        "The processes of mini-sglang and the messages between them",
        "A client talks HTTP to the API server. The API server pushes TokenizeMsg to the "
        "tokenizer, which pushes UserMsg to the scheduler of rank 0. Rank 0 republishes each "
        "message to the other ranks over PUB/SUB. Rank 0 pushes DetokenizeMsg to the "
        "detokenizer, which pushes UserReply back to the API server. Each scheduler owns an "
        "Engine on its GPU; the engines all-reduce over NCCL.",
    )
    top, bottom = 95, 315  # the request row and the reply row
    cl_x, cl_w = 6, 66
    api_x, api_w = 130, 136
    tok_x, tok_w = 380, 142
    sch_x, sch_w = 654, 140

    # client
    s.box(cl_x, 150, cl_w, 150, GREY)
    s.text(cl_x + cl_w / 2, 221, "client", size=15, anchor="middle", bold=True)

    # API server
    cx = api_x + api_w / 2
    s.box(api_x, 40, api_w, 330, BLUE)
    s.text(cx, 68, "API server", size=16, anchor="middle", bold=True)
    s.text(cx, 88, "1 process", size=13, anchor="middle", muted=True)
    s.text(cx, 160, "FastAPI", size=14, anchor="middle")
    s.text(cx, 196, "FrontendManager", size=13.5, anchor="middle")
    s.lines(
        cx,
        218,
        ["a uid per request", "replies per uid", "streams SSE"],
        size=13,
        anchor="middle",
        muted=True,
        gap=1.45,
    )

    # tokenizer and detokenizer, one process by default
    tcx = tok_x + tok_w / 2
    s.box(tok_x - 10, 26, tok_w + 20, 358, None, rx=14, dashed=True, stroke_width=1.2)
    s.text(tcx, 200, "one process", size=13, anchor="middle", muted=True)
    s.text(tcx, 217, "by default", size=13, anchor="middle", muted=True)
    for y, title, mgr, job in (
        (40, "tokenizer", "TokenizeManager", "text → ids"),
        (260, "detokenizer", "DetokenizeManager", "ids → text"),
    ):
        s.box(tok_x, y, tok_w, 112, TEAL)
        s.text(tcx, y + 27, title, size=16, anchor="middle", bold=True)
        s.text(tcx, y + 50, "tokenize_worker", size=12.5, anchor="middle", mono=True)
        s.text(tcx, y + 72, mgr, size=13, anchor="middle")
        s.text(tcx, y + 94, job, size=13, anchor="middle", muted=True)

    # scheduler of rank 0 with its engine
    scx = sch_x + sch_w / 2
    s.box(sch_x, 40, sch_w, 330, ORANGE)
    s.text(scx, 68, "scheduler", size=16, anchor="middle", bold=True)
    s.text(scx, 88, "rank 0", size=13, anchor="middle", muted=True)
    y = s.lines(
        sch_x + 12,
        118,
        ["PrefillManager", "DecodeManager", "CacheManager", "TableManager"],
        size=13,
        gap=1.42,
    )
    s.text(sch_x + 12, y + 2, "+ ZMQ queues", size=13, muted=True)
    ex, ew = sch_x + 10, sch_w - 20
    s.box(ex, 250, ew, 108, PURPLE, solid_bg=True)
    s.text(scx, 274, "Engine", size=15, anchor="middle", bold=True)
    s.lines(
        scx,
        295,
        ["GPU 0 · model", "KV pool · sampler", "attention backend"],
        size=12.5,
        anchor="middle",
        muted=True,
        gap=1.4,
    )

    # the other ranks, drawn as a stack of cards
    ry, rh = 470, 140
    for off in (12, 6):
        s.box(sch_x + off, ry + off, sch_w - 12, rh, ORANGE, solid_bg=True, fill_opacity=0.1)
    s.box(sch_x, ry, sch_w, rh, ORANGE, solid_bg=True)
    s.text(scx, ry + 25, "scheduler", size=16, anchor="middle", bold=True)
    s.text(scx, ry + 44, "ranks ≥ 1", size=13, anchor="middle", muted=True)
    s.box(ex, ry + 56, ew, 72, PURPLE, solid_bg=True)
    s.text(scx, ry + 80, "Engine", size=15, anchor="middle", bold=True)
    s.lines(
        scx,
        ry + 100,
        ["GPU r, its weight", "shard; no replies"],
        size=12.5,
        anchor="middle",
        muted=True,
        gap=1.4,
    )

    # HTTP in and out
    mid = (cl_x + cl_w + api_x) / 2
    s.arrow(cl_x + cl_w, 195, api_x - 1, 195)
    s.text(mid, 187, "HTTP", size=13, anchor="middle", bold=True)
    s.arrow(api_x - 1, 255, cl_x + cl_w + 1, 255)
    s.text(mid, 275, "SSE", size=13, anchor="middle", bold=True)

    def msg(x1: float, x2: float, y: float, names: Sequence[str]) -> None:
        s.arrow(x1, y, x2, y)
        m = (x1 + x2) / 2
        base = y - 9 - 17 * (len(names) - 1)
        for i, n in enumerate(names):
            s.text(m, base + 17 * i, n, size=13, anchor="middle", bold=True)
        s.text(m, y + 19, "PUSH → PULL", size=12, anchor="middle", muted=True, mono=True)

    api_r, tok_r = api_x + api_w, tok_x + tok_w
    msg(api_r, tok_x - 1, top, ["TokenizeMsg", "AbortMsg"])
    msg(tok_r, sch_x - 1, top, ["UserMsg", "AbortBackendMsg"])
    msg(sch_x, tok_r + 1, bottom, ["DetokenizeMsg"])
    msg(tok_x, api_r + 1, bottom, ["UserReply"])

    # rank 0 republishes what it received
    px = sch_x + 26
    s.arrow(px, 370, px, ry - 1)
    s.text(px - 10, 404, "PUB → SUB", size=12.5, anchor="end", bold=True, mono=True)
    s.text(px - 10, 423, "the same message bytes;", size=13, anchor="end", muted=True)
    s.text(px - 10, 440, "their count over gloo", size=13, anchor="end", muted=True)

    # tensor-parallel collectives between the engines
    nx = ex + ew - 12
    s.arrow(nx, 359, nx, ry + 55, color=PURPLE, dashed=True, arrow_start=True, width=1.8)
    s.text(nx - 8, 414, "NCCL", size=13, anchor="end", bold=True, color=PURPLE)
    s.text(nx - 8, 431, "all-reduce", size=13, anchor="end", color=PURPLE)

    # legend
    lx, ly, lw = 6, 478, 450
    s.box(lx, ly, lw, 132, None, rx=10, stroke_width=1)
    s.arrow(lx + 14, ly + 26, lx + 64, ly + 26)
    s.text(lx + 76, ly + 31, "a ZMQ message (msgpack bytes)", size=13)
    s.arrow(
        lx + 14, ly + 54, lx + 64, ly + 54, color=PURPLE, dashed=True, arrow_start=True, width=1.8
    )
    s.text(lx + 76, ly + 59, "a collective on GPU tensors", size=13)
    s.lines(
        lx + 14,
        ly + 88,
        [
            "BatchTokenizerMsg, BatchBackendMsg and",
            "BatchFrontendMsg carry several messages at once.",
        ],
        size=13,
        muted=True,
        gap=1.4,
    )
    return s.render()


# =============================================================================
# Figure: the life of one request, as a sequence diagram
# =============================================================================


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
            f'<path d="M{lx1},{_num(y1 + 8)} a8,8 0 0 1 8,-8 H{_num(lx1 + tw)} v18 l-9,9 H{lx1} z" '
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
            f'<path d="M{_num(x)},{head_y + head_h} L{_num(x)},{_num(end_y)}" fill="none" '
            f'class="fg-stroke" stroke="{FALLBACK_FG}" stroke-opacity="0.4" stroke-width="1.2" '
            f'stroke-dasharray="5 4"/>'
        )
    s.body[first:first] = under
    for (label, color), x in zip(names, xs):
        w = max(92, text_width(label, 15, bold=True) + 24)
        s.box(x - w / 2, head_y, w, head_h, color, solid_bg=True)
        s.text(x, head_y + 27, label, size=15, anchor="middle", bold=True)
    s.height = end_y + 8
    return s.render()


# =============================================================================
# Figure: continuous batching and chunked prefill, step by step
# =============================================================================


def fig_batching() -> str:
    """Which requests run in which scheduler step."""
    steps = 10
    # per request: its arrival step and {step: kind}; P prefill, P1/P2 chunks, D decode, E last token.
    # A and B arrive together; C is long (two chunks); D arrives while C's first chunk runs.
    rows: list[tuple[str, int, dict[int, str]]] = [
        ("A", 1, {1: "P", 2: "D", 5: "D", 6: "D", 7: "E"}),
        ("B", 1, {1: "P", 2: "D", 5: "D", 6: "E"}),
        ("C", 2, {3: "P1", 4: "P2", 5: "D", 6: "D", 7: "D", 8: "D", 9: "D", 10: "E"}),
        ("D", 3, {4: "P", 5: "D", 6: "D", 7: "D", 8: "D", 9: "E"}),
    ]
    x0, y0, cw, ch = 100, 70, 67, 48
    width = x0 + steps * cw + 16
    s = Svg(
        "batching",
        width,
        480,
        "Continuous batching and chunked prefill",
        "A grid of scheduler steps against four requests. Each step runs either one prefill "
        "batch or one decode batch. Requests join the decode batch right after their prefill "
        "and leave as soon as they finish. The long request C is prefilled in two chunks; "
        "meanwhile A and B wait.",
    )
    s.text(x0 - 12, y0 - 34, "step", size=13, anchor="end", muted=True)
    kinds: dict[int, str] = {}
    for _, _, cells in rows:
        for k, v in cells.items():
            kinds[k] = "prefill" if v.startswith("P") else "decode"
    for k in range(1, steps + 1):
        cx = x0 + (k - 0.5) * cw
        s.text(cx, y0 - 34, str(k), size=15, anchor="middle", bold=True)
        color = ORANGE if kinds.get(k) == "prefill" else GREEN
        s.box(
            x0 + (k - 1) * cw + 5,
            y0 - 24,
            cw - 10,
            20,
            color,
            rx=4,
            fill_opacity=0.35,
            stroke_width=1,
        )
        s.text(cx, y0 - 9.5, kinds.get(k, ""), size=12, anchor="middle")

    # the steps where the running requests wait for a prefill
    for k in (3, 4):
        s.box(
            x0 + (k - 1) * cw + 5,
            y0 + 10,
            cw - 10,
            2 * ch - 4,
            RED,
            rx=6,
            dashed=True,
            fill_opacity=0.06,
            stroke_width=1.2,
        )
    for r, (name, arrive, cells) in enumerate(rows):
        top = y0 + 12 + r * ch
        s.text(16, top + ch / 2 + 3, f"request {name}", size=14, bold=True)
        s.line(x0, top + ch - 3, x0 + steps * cw, top + ch - 3, color=None, opacity=0.12, width=1)
        first = min(cells)
        if first > arrive:
            wx1 = x0 + (arrive - 1) * cw + 10
            wx2 = x0 + (first - 1) * cw - 4
            s.line(
                wx1, top + ch / 2 - 5, wx2, top + ch / 2 - 5, color=None, dashed=True, opacity=0.6
            )
            s.text(
                (wx1 + wx2) / 2, top + ch / 2 + 12, "waits", size=12, anchor="middle", muted=True
            )
        s.line(
            x0 + (arrive - 1) * cw + 2,
            top + 6,
            x0 + (arrive - 1) * cw + 2,
            top + ch - 10,
            color=None,
            width=2.5,
            opacity=0.8,
        )
        for k, v in cells.items():
            cx = x0 + (k - 1) * cw + 5
            color = ORANGE if v.startswith("P") else GREEN
            s.box(
                cx, top + 5, cw - 10, ch - 15, color, rx=6, fill_opacity=0.5 if v == "E" else 0.28
            )
            label = {"P": "prefill", "P1": "chunk 1", "P2": "chunk 2", "D": "token", "E": "last ✓"}[
                v
            ]
            s.text(cx + (cw - 10) / 2, top + ch / 2 + 2, label, size=12.5, anchor="middle")
    gy = y0 + 12 + len(rows) * ch
    s.text(
        x0 + 3 * cw,
        gy + 18,
        "A and B wait: a prefill step runs no decode",
        size=13,
        anchor="middle",
        color=RED,
    )

    # legend and notes
    ly = gy + 46
    s.box(x0, ly, 40, 22, ORANGE, rx=5, fill_opacity=0.28)
    s.text(
        x0 + 52, ly + 16, "prefill: a prompt, or one chunk of it, in one forward pass", size=13.5
    )
    s.box(x0, ly + 32, 40, 22, GREEN, rx=5, fill_opacity=0.28)
    s.text(x0 + 52, ly + 48, "decode: one new token for every running request", size=13.5)
    s.line(x0 + 20, ly + 66, x0 + 20, ly + 88, color=None, width=2.5, opacity=0.8)
    s.text(x0 + 52, ly + 82, "the request arrives", size=13.5)
    s.lines(
        x0,
        ly + 120,
        [
            "C's prompt is longer than the token budget of one prefill (max_extend_tokens),",
            "so it runs in two chunks; D fits in what is left in step 4 and joins that batch.",
        ],
        size=13,
        muted=True,
        gap=1.4,
    )
    return s.render()


# =============================================================================
# Figure: overlap scheduling
# =============================================================================


def fig_overlap() -> str:
    """The CPU and the GPU over time, with and without overlap scheduling."""
    prep, fwd, proc = 2.5, 5.0, 2.2  # time units for one step's CPU and GPU work
    span = 2 * (prep + fwd + proc) + prep + 2.5  # two steps, then the start of the third
    lane_x, lane_w = 70, 716
    unit = lane_w / span
    s = Svg(
        "overlap",
        800,
        440,
        "Overlap scheduling",
        "Two timelines of the CPU and the GPU. Without overlap, the GPU idles while the CPU "
        "processes one step's tokens and prepares the next batch. With overlap, the CPU "
        "prepares and launches step k+1 while step k runs, and only then reads step k's tokens, "
        "so the GPU runs one forward pass after another.",
    )
    clip = f"{s.name}-clip"
    s.defs.append(
        f'<clipPath id="{clip}"><rect x="{lane_x}" y="0" width="{_num(lane_w)}" height="440"/></clipPath>'
    )

    def block(t0: float, dt: float, y: float, label: str, color: str) -> None:
        x, w = lane_x + t0 * unit, dt * unit
        s.box(x + 1, y, w - 2, 32, color, rx=5, fill_opacity=0.3, stroke_width=1.2)
        s.text(x + w / 2, y + 21, label, size=13, anchor="middle")

    def wait(t0: float, dt: float, y: float) -> None:
        x1, x2 = lane_x + t0 * unit + 6, lane_x + (t0 + dt) * unit - 6
        if x2 - x1 < 20:
            return
        s.line(x1, y + 16, x2, y + 16, color=None, dashed=True, opacity=0.5, width=1.2)
        if x2 - x1 > 56:
            s.label_bg((x1 + x2) / 2, y + 20.5, "wait", size=12.5, muted=True)

    def idle(t0: float, dt: float, y: float) -> None:
        x, w = lane_x + t0 * unit, dt * unit
        s.box(x + 1, y, w - 2, 32, RED, rx=5, dashed=True, fill_opacity=0.07, stroke_width=1)
        s.text(x + w / 2, y + 21, "idle", size=13, anchor="middle", color=RED)

    def lanes(y: float, title: str, sub: str) -> tuple[float, float]:
        s.text(8, y - 16, title, size=15, bold=True)
        s.text(170, y - 16, sub, size=13, muted=True, mono=True)
        cpu_y, gpu_y = y, y + 46
        s.text(lane_x - 12, cpu_y + 21, "CPU", size=13.5, anchor="end", bold=True)
        s.text(lane_x - 12, gpu_y + 21, "GPU", size=13.5, anchor="end", bold=True)
        for yy in (cpu_y, gpu_y):
            s.line(lane_x, yy + 34, lane_x + lane_w, yy + 34, color=None, opacity=0.2, width=1)
        return cpu_y, gpu_y

    # without overlap: prepare k, launch, wait for its tokens, process k, repeat
    cpu_y, gpu_y = lanes(62, "Without overlap", "normal_loop()")
    s.body.append(f'<g clip-path="url(#{clip})">')
    t = 0.0
    idle(0, prep, gpu_y)
    for k in (1, 2, 3):
        block(t, prep, cpu_y, f"prepare {k}", ORANGE)
        t += prep
        block(t, fwd, gpu_y, f"forward {k}", PURPLE)
        wait(t, fwd, cpu_y)
        t += fwd
        block(t, proc, cpu_y, f"process {k}", AMBER)
        idle(t, proc + prep, gpu_y)
        t += proc
    s.body.append("</g>")

    # with overlap: the CPU runs one step ahead of the GPU
    cpu_y, gpu_y = lanes(238, "With overlap", "overlap_loop(last_data)")
    s.body.append(f'<g clip-path="url(#{clip})">')
    block(0, prep, cpu_y, "prepare 1", ORANGE)
    idle(0, prep, gpu_y)
    g = prep
    for k in range(1, 6):
        block(g, fwd, gpu_y, f"forward {k}", PURPLE)
        # while forward k runs: read the tokens of step k-1, prepare and launch k+1, wait
        t = g
        if k > 1:
            block(t, proc, cpu_y, f"process {k - 1}", AMBER)
            t += proc
        block(t, prep, cpu_y, f"prepare {k + 1}", ORANGE)
        t += prep
        wait(t, g + fwd - t, cpu_y)
        g += fwd
    s.body.append("</g>")
    s.lines(
        lane_x,
        gpu_y + 66,
        [
            "Each turn of the loop launches step k+1 first and only then reads step k's",
            "tokens, so the GPU always has the next forward pass queued.",
        ],
        size=13,
        muted=True,
        gap=1.4,
    )
    s.arrow(lane_x, 418, lane_x + lane_w, 418)
    s.text(lane_x + lane_w, 436, "time", size=13, anchor="end", muted=True)
    return s.render()


# =============================================================================
# Figure: the module map, by dependency layer
# =============================================================================


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
            s.pill(bx + bw - 7, by + 16, chapter, color, size=12, anchor="end")
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
        f'<text x="{ax + 13}" y="{_num(mid)}" font-size="13" text-anchor="middle" '
        f'transform="rotate(90 {ax + 13} {_num(mid)})" class="muted" fill="{FALLBACK_MUTED}">'
        f"{_esc('imports only from its own layer or below')}</text>"
    )
    s.text(
        left,
        y + 12,
        "The badge is the chapter that builds the package; later chapters add files to several.",
        size=13,
        muted=True,
    )
    return s.render()


# =============================================================================
# registry and entry points
# =============================================================================

FIGURES: dict[str, Callable[[], str]] = {
    "step0-loop": fig_step0_loop,
    "processes": fig_processes,
    "request-life": fig_request_life,
    "batching": fig_batching,
    "overlap": fig_overlap,
    "module-map": fig_module_map,
}


def _chapter_figures() -> dict[str, Callable[[], str]]:
    """Figures of the chapters, one module each in tools/chapter_figures/ (chNN.py), each
    with its own FIGURES dict; they build on the Svg helper above."""
    import importlib.util

    found: dict[str, Callable[[], str]] = {}
    folder = Path(__file__).resolve().parent / "chapter_figures"
    for path in sorted(folder.glob("ch*.py")):
        spec = importlib.util.spec_from_file_location(f"tools.chapter_figures.{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, fn in module.FIGURES.items():
            if name in FIGURES or name in found:
                raise KeyError(f"figure {name!r} of {path.name} is defined twice")
            found[name] = fn
    return found


FIGURES.update(_chapter_figures())


def generate(out_dir: str | Path = DEFAULT_OUT, names: Iterable[str] | None = None) -> list[Path]:
    """Write the figures to ``out_dir/<name>.svg``; return the paths written or unchanged.

    A file is rewritten only when its text changes, so that ``mkdocs serve``,
    which watches the docs folder, does not rebuild in a loop.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    selected = list(FIGURES) if names is None else list(names)
    unknown = [n for n in selected if n not in FIGURES]
    if unknown:
        raise KeyError(f"unknown figure(s): {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    paths = []
    for name in selected:
        svg = FIGURES[name]()
        path = out / f"{name}.svg"
        if not path.exists() or path.read_text(encoding="utf-8") != svg:
            path.write_text(svg, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "names", nargs="*", help=f"figures to write (default: all of {', '.join(FIGURES)})"
    )
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="output folder (default: docs/figures)"
    )
    args = parser.parse_args(argv)
    for path in generate(args.out, args.names or None):
        try:
            shown = path.resolve().relative_to(Path.cwd())
        except ValueError:
            shown = path
        print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
