"""The SVG library the figures draw with: the ``Svg`` builder and the shared constants.

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
  text between tags goes through Markdown's inline rules. ``esc`` writes every
  character that Markdown, attr_list or arithmatex would act on as a numeric
  character reference, and the document has no blank lines and no indentation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def esc(text: str) -> str:
    """Escape text content for XML and make it inert for Markdown."""
    out = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "".join(_MD_SPECIAL.get(ch, ch) for ch in out)


def num(v: float) -> str:
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
        geo = f'x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}" rx="{num(rx)}"'
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        if solid_bg:
            self.body.append(f'<rect {geo} class="bg" fill="{FALLBACK_BG}"/>')
        if color is None:
            self.body.append(
                f'<rect {geo} fill="none" class="fg-stroke" stroke="{FALLBACK_FG}" '
                f'stroke-opacity="0.55" stroke-width="{num(stroke_width)}"{dash}/>'
            )
        else:
            self.body.append(
                f'<rect {geo} fill="{color}" fill-opacity="{num(fill_opacity)}" '
                f'stroke="{color}" stroke-width="{num(stroke_width)}"{dash}/>'
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
        attrs = [f'x="{num(x)}" y="{num(y)}"', f'font-size="{num(size)}"']
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
        self.body.append(f"<text {' '.join(attrs)}>{esc(s)}</text>")

    def lines(
        self,
        x: float,
        y: float,
        rows: Sequence[str],
        size: float = 14,
        gap: float = 1.35,
        **kw: Any,
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
        attrs = [f'd="{d}"', 'fill="none"', f'stroke-width="{num(width)}"']
        if color is None:
            attrs.append(f'class="fg-stroke" stroke="{FALLBACK_FG}"')
        else:
            attrs.append(f'stroke="{color}"')
        if opacity is not None:
            attrs.append(f'stroke-opacity="{num(opacity)}"')
        if dashed:
            attrs.append('stroke-dasharray="5 4"')
        if arrow_end:
            attrs.append(f'marker-end="url(#{self.marker(color)})"')
        if arrow_start:
            attrs.append(f'marker-start="url(#{self.marker(color, start=True)})"')
        self.body.append(f"<path {' '.join(attrs)}/>")

    def arrow(self, x1: float, y1: float, x2: float, y2: float, **kw: Any) -> None:
        """A straight arrow from (x1, y1) to (x2, y2)."""
        self.path(f"M{num(x1)},{num(y1)} L{num(x2)},{num(y2)}", **kw)

    def line(self, x1: float, y1: float, x2: float, y2: float, **kw: Any) -> None:
        """A straight line without arrowheads."""
        kw.setdefault("arrow_end", False)
        self.path(f"M{num(x1)},{num(y1)} L{num(x2)},{num(y2)}", **kw)

    def pill(
        self, x: float, y: float, s: str, color: str, size: float = 12, anchor: str = "start"
    ) -> float:
        """A small rounded label (a chapter badge), ``y`` its vertical centre; returns its width."""
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
        **kw: Any,
    ) -> None:
        """Text on a patch of page background, to sit on top of a line."""
        w = text_width(s, size, mono=kw.get("mono", False), bold=kw.get("bold", False)) + 2 * pad
        left = x - w / 2 if anchor == "middle" else (x - w if anchor == "end" else x)
        self.body.append(
            f'<rect x="{num(left)}" y="{num(y - size * 0.95)}" width="{num(w)}" '
            f'height="{num(size * 1.3)}" rx="3" class="bg" fill="{FALLBACK_BG}"/>'
        )
        self.text(x, y, s, size=size, anchor=anchor, **kw)

    # ------------------------------------------------------------------ output
    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" '
            f'viewBox="0 0 {num(self.width)} {num(self.height)}" '
            f'role="img" aria-labelledby="{self.name}-title {self.name}-desc" '
            f'font-family="{FONT}" class="book-svg book-svg-{self.name}">'
        )
        out = [head]
        out.append(f'<title id="{self.name}-title">{esc(self.title)}</title>')
        out.append(f'<desc id="{self.name}-desc">{esc(self.desc)}</desc>')
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
