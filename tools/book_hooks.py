"""mkdocs hooks that keep the text tied to the code (one source for each thing).

In a page:

    <!-- code[NN]: minisgl/core.py::Req -->       the source of Req as chapter NN has it
                                                   (NN: 7, 07, or a project, P1)
    <!-- code[NN]: minisgl/core.py::Req.extend_len -->   a method
    <!-- code[NN]: minisgl/core.py -->            a whole file at chapter NN
    <!-- code: examples/ch00_step0.py::rms_norm -->  a file outside the package
    <!-- tree[NN] -->                              chapter NN's package files, created /
                                                   modified / early marked
    <!-- roadmap -->                               every planned chapter and its status
    <!-- reading-times -->                         each part's words and reading time, counted

A marker that names a missing file or symbol stops the build with an error.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.book import (  # noqa: E402
    Book,
    BookError,
    Manifest,
    chapter_name,
    parse_chapter,
    tomllib,
)

CODE_RE = re.compile(
    r"^<!-- code(?:\[(?P<chapter>\d+|[Pp]\d+)\])?: (?P<path>[^\s:]+)(?:::(?P<symbol>[\w.]+))? -->$",
    re.M,
)
TREE_RE = re.compile(r"^<!-- tree\[(?P<chapter>\d+|[Pp]\d+)\] -->$", re.M)
ROADMAP_RE = re.compile(r"^<!-- roadmap -->$", re.M)
READING_RE = re.compile(r"^<!-- reading-times -->$", re.M)
WORDS_PER_MINUTE = 150  # a pace for technical text
CHALLENGES_RE = re.compile(r"^<!-- challenges -->$", re.M)
ANIMATION_RE = re.compile(r"^<!-- animation: (?P<name>[\w-]+) -->$", re.M)
PRINTS_RE = re.compile(
    r"^(?P<marker><!-- prints: [^\n]+ -->\n)```text\n(?P<body>.*?)\n```$", re.M | re.S
)
PARITY_RE = re.compile(
    r"^parity: models=(?P<models>\d+) prompts=(?P<prompts>\d+) "
    r"tokens=(?P<matched>\d+)/(?P<total>\d+) min_margin=(?P<margin>[\d.]+)$"
)
TABLE_HEAD_RE = re.compile(r"^model {2,}\S")
FIGURE_RE = re.compile(
    r'^<div class="book-figure" markdown>\n--8<-- "docs/(?P<path>figures/[\w.-]+\.svg)"\n</div>$',
    re.M,
)
# a figure's include that FIGURE_RE did not frame (the caption inside the frame, say)
STRAY_FIGURE_RE = re.compile(
    r'^(?!<div class="book-figure" style=)[^\n]*\n(--8<-- "docs/figures/[^"]+")$', re.M
)
SMALLEST_TEXT_PX = 12  # a figure never shows text smaller than this; narrower screens scroll it


def _source_path(book: Book, chapter: Optional[int], path: str) -> Path:
    if chapter is not None and path.startswith(book.package + "/"):
        files = book.package_files(chapter)
        if path not in files:
            raise BookError(f"{path} does not exist at {chapter_name(chapter)}")
        return files[path]
    full = book.root / path
    if not full.exists():
        raise BookError(f"{path} does not exist")
    return full


def symbol_lines(source: str, qualname: str) -> Tuple[int, int]:
    """1-based first and last line of a class, function or method (decorators included)."""
    scope: List[ast.stmt] = ast.parse(source).body
    node: Optional[ast.AST] = None
    for part in qualname.split("."):
        candidates = [
            n
            for n in scope
            if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name == part
        ]
        if not candidates:
            raise BookError(f"{qualname}: no {part!r}")
        node = candidates[-1]
        scope = getattr(node, "body", [])
    assert node is not None
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first, node.end_lineno or node.lineno


def render_code(book: Book, chapter: Optional[int], path: str, symbol: Optional[str]) -> str:
    file = _source_path(book, chapter, path)
    source = file.read_text()
    lines = source.splitlines()
    if symbol:
        first, last = symbol_lines(source, symbol)
    else:
        first, last = 1, len(lines)
    body = "\n".join(lines[first - 1 : last])
    where = f"{path}" + (f" ({chapter_name(chapter)})" if chapter is not None else "")
    change = _change_since_previous(book, chapter, path, symbol, body)
    options = f'linenums="{first}"'
    if change is not None and change.changed:
        options += f' hl_lines="{change.changed}"'
        where += f", highlighted: changed since {chapter_name(change.since)}"
    elif change is not None and change.diff is None:
        where += f", new since {chapter_name(change.since)}"
    language = "python" if path.endswith(".py") else "cpp"  # the kernels' .cu, .cuh, .h, .cpp
    block = f'```{language} title="{where}" {options}\n{body}\n```'
    if change is not None and change.diff:
        inner = "\n".join(f"    {line}".rstrip() for line in change.diff.split("\n"))
        block += (
            f'\n\n??? note "What changed since {chapter_name(change.since)} (a diff of the two '
            f'versions)"\n\n    ```diff\n{inner}\n    ```'
        )
    posed = _exercises_in(book, chapter, path, symbol)
    if not posed:
        return block
    # the solution of an exercise is not in view when the exercise is posed: folded
    names = ", ".join(f"`{ex.id}`" for ex in posed)
    title = f"The book's {symbol or path}: exercise {names} asks you to write it, open when done"
    inner = "\n".join(("    " + line).rstrip() for line in block.split("\n"))
    return f'??? example "{title}"\n{inner}'


@dataclass
class Change:
    since: int  # the chapter before, whose version it is compared with
    changed: str  # the changed or added lines, 1-based in the shown block ("3-5 9")
    diff: Optional[str]  # a unified diff; None where the symbol is new


def _change_since_previous(
    book: Book, chapter: Optional[int], path: str, symbol: Optional[str], body: str
) -> Optional[Change]:
    """How the shown code differs from the previous chapter's version of it: None where
    there is nothing to compare (a file outside the package, a file new in this chapter, an
    unchanged one, or a whole file, which `steps.py diff` shows)."""
    if chapter is None or symbol is None or not path.startswith(book.package + "/"):
        return None
    before = book.previous(chapter)
    if before is None:
        return None
    old_file = book.package_files(before.number).get(path)
    if old_file is None:
        return None
    old_source = old_file.read_text()
    try:
        first, last = symbol_lines(old_source, symbol)
    except BookError:
        return Change(before.number, "", None)  # the file existed, this symbol did not
    old = old_source.splitlines()[first - 1 : last]
    new = body.split("\n")
    if old == new:
        return None
    spans = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            spans.append(f"{j1 + 1}" if j2 - j1 == 1 else f"{j1 + 1}-{j2}")
    diff = "\n".join(
        difflib.unified_diff(old, new, before.name, chapter_name(chapter), lineterm="", n=2)
    )
    return Change(before.number, " ".join(spans), diff)


def _exercises_in(book: Book, chapter: Optional[int], path: str, symbol: Optional[str]) -> list:
    """The exercises of `chapter` whose function the include shows (itself, its class, or
    the whole file); for a file outside the package (no chapter), any chapter's."""
    try:
        chapters = book.chapters if chapter is None else [book.chapter(chapter)]
    except BookError:
        return []
    exercises = [ex for m in chapters for ex in m.exercises]
    return [
        ex
        for ex in exercises
        if ex.file == path
        and (symbol is None or ex.function == symbol or ex.function.startswith(symbol + "."))
    ]


def render_tree(book: Book, chapter: int) -> str:
    me = book.chapter(chapter)
    files = sorted(book.package_files(chapter))
    marks = {p: "created" for p in me.creates}
    marks.update({p: "modified" for p in me.modifies})
    marks.update({p: "early (from a later chapter)" for p in me.early})
    if not files:
        return "*(no package files yet)*"
    rows = []
    previous: List[str] = []
    for path in files:
        parts = path.split("/")
        common = 0
        while common < min(len(previous), len(parts) - 1) and previous[common] == parts[common]:
            common += 1
        for depth in range(common, len(parts) - 1):
            rows.append(("    " * depth + parts[depth] + "/", ""))
        rows.append(("    " * (len(parts) - 1) + parts[-1], marks.get(path, "")))
        previous = parts[:-1]
    width = max(len(r[0]) for r in rows) + 2
    text = "\n".join(
        f"    {name:{width}}{('<- ' + mark) if mark else ''}".rstrip() for name, mark in rows
    )
    summary = f"The whole package after this {me.kind}: {len(files)} files"
    summary += f" ({len(marks)} of them created or changed here, marked <-)" if marks else ""
    # folded: the page's list under it, a line per file and why, is what a reader needs first
    return f'??? abstract "{summary}"\n    ```text\n{text}\n    ```'


def render_roadmap(book: Book) -> str:
    settings = tomllib.loads((book.root / "chapters" / "book.toml").read_text())
    written = {m.label: m for m in book.chapters if m.page}
    rows = [
        "| # | chapter | what the engine can do at its end | status |",
        "| --- | --- | --- | --- |",
    ]
    for item in settings.get("plan", []):
        label = item["number"]
        title = item["title"]
        if label in written:
            page = Path(written[label].page).relative_to("docs").as_posix()
            title = f"[{title}]({page})"
            status = "written"
        else:
            status = "not yet written"
        rows.append(f"| {label} | {title} | {item['summary']} | {status} |")
    return "\n".join(rows)


def _words(path: Path) -> int:
    return len(path.read_text().split())


def _reading_time(words: int) -> str:
    minutes = max(5, round(words / WORDS_PER_MINUTE / 5) * 5)
    hours, minutes = divmod(minutes, 60)
    return (
        f"{hours} h {minutes} min"
        if hours and minutes
        else f"{hours} h"
        if hours
        else f"{minutes} min"
    )


def render_reading_times(book: Book, depth: int) -> str:
    """Each part's words (the Markdown source of its written chapters) and reading time, then
    the overview pages and the total: counted at every build, so never stale."""
    settings = tomllib.loads((book.root / "chapters" / "book.toml").read_text())
    pages = {m.label: book.root / m.page for m in book.chapters if m.page}
    rows = ["| part | chapters | words | reading time (about) |", "| --- | --- | --- | --- |"]
    total = 0
    for part in settings.get("parts", []):
        numbers = part["chapters"]
        span = numbers[0] if len(numbers) == 1 else f"{numbers[0]} to {numbers[-1]}"
        written = [n for n in numbers if n in pages]
        if not written:
            rows.append(f"| {part['name']} | {span} | not written yet | |")
            continue
        words = sum(_words(pages[n]) for n in written)
        total += words
        note = (
            "" if len(written) == len(numbers) else f" ({len(written)} of {len(numbers)} written)"
        )
        rows.append(f"| {part['name']} | {span} | {words:,}{note} | {_reading_time(words)} |")
    up = "../" * depth
    overview = [("Architecture", "architecture.md"), ("How the book checks itself", "machinery.md")]
    described = " and ".join(
        f"[{title}]({up}{page}) ({_words(book.root / 'docs' / page):,} words, "
        f"{_reading_time(_words(book.root / 'docs' / page))})"
        for title, page in overview
    )
    return "\n".join(rows) + (
        f"\n\nThe written chapters come to {total:,} words, about "
        f"{_reading_time(total)} of reading; the two overview pages add {described}."
    )


def fold_parity_table(block: re.Match) -> str:
    """A "what it prints" block whose output ends in a parity table shows the table folded,
    with its summary line (the `parity:` line, in words) as the fold's title. The block in the
    page's source stays as the main prints it, so `steps.py check` compares it whole."""
    lines = block["body"].split("\n")
    end = next((i for i, line in enumerate(lines) if PARITY_RE.match(line)), None)
    if end is None:
        return block[0]
    start = next((i for i in range(end, -1, -1) if TABLE_HEAD_RE.match(lines[i])), None)
    if start is None:
        return block[0]
    summary = PARITY_RE.match(lines[end])
    assert summary is not None
    matched, total = int(summary["matched"]), int(summary["total"])
    kind = "success" if matched == total else "failure"
    title = (
        f"Parity with transformers: {summary['models']} models x {summary['prompts']} prompts, "
        f"{matched} of {total} tokens the same; smallest top-2 margin {summary['margin']}"
    )
    table = "\n".join(f"    {line}".rstrip() for line in lines[start : end + 1])
    parts = [block["marker"].rstrip("\n")]
    before, after = lines[:start], lines[end + 1 :]
    while before and not before[-1].strip():
        before.pop()
    if before:
        parts.append("```text\n" + "\n".join(before) + "\n```")
    parts.append(f'??? {kind} "{title}"\n\n    ```text\n{table}\n    ```')
    if any(line.strip() for line in after):
        parts.append("```text\n" + "\n".join(after) + "\n```")
    return "\n\n".join(parts)


def figure_min_width(svg: str) -> int:
    """The width (CSS px) at which the figure's smallest text is SMALLEST_TEXT_PX tall."""
    view = re.search(r'viewBox="[\d.]+ [\d.]+ (?P<w>[\d.]+) [\d.]+"', svg)
    # an attribute (the book's own figures) or a style (matplotlib's text)
    sizes = [float(v) for v in re.findall(r'font-size(?:="|:\s*)([\d.]+)', svg)]
    if view is None or not sizes:
        raise BookError("a figure needs a viewBox and font sizes to be scaled legibly")
    return round(float(view["w"]) * SMALLEST_TEXT_PX / min(sizes))


def render_figure(figure: re.Match, depth: int) -> str:
    """An inline figure keeps its smallest text at 12 px or more (on a narrow screen it
    scrolls sideways instead of shrinking) and links to its SVG file, to open full size."""
    path = ROOT / "docs" / figure["path"]
    if path.exists():  # drawn by the build's pre-build hook
        svg = path.read_text()
    else:  # a page expanded outside a build (the tests): draw it here
        from tools import plot_benchmarks
        from tools.figures import FIGURES

        if path.stem in plot_benchmarks.PLOTS:  # matplotlib's, from the measurements
            with tempfile.TemporaryDirectory() as out:
                plot = plot_benchmarks.PLOTS[path.stem]
                svg = plot(ROOT / "docs" / "data", Path(out)).read_text()
        else:
            svg = FIGURES[path.stem]()
    href = "../" * depth + figure["path"]
    return (
        f'<div class="book-figure" style="--book-figure-min: {figure_min_width(svg)}px" markdown>\n'
        f'--8<-- "docs/{figure["path"]}"\n</div>\n'
        f'<div class="book-figure-open" markdown>[Open the figure full size]({href})</div>'
    )


def render_challenges(book: Book, depth: int) -> str:
    """Every challenge: its title, the chapter it builds on, its task, how to start it."""
    from tools.challenge import challenges

    pages = {m.number: m.page for m in book.chapters if m.page}
    parts = []
    for c in challenges():
        page = pages.get(c.chapter)
        after = chapter_name(c.chapter)
        if page:
            after = f"[{after}]({'../' * depth}{page.removeprefix('docs/')})"
        parts += [
            f"## {c.title}",
            "",
            f"`{c.id}` · builds on {after} · {c.summary}",
            "",
            c.task.strip(),
            "",
            "```bash",
            f"python tools/challenge.py start {c.id}   # my-challenges/{c.id}/{c.file}",
            f"python tools/challenge.py check {c.id}",
            "```",
            "",
        ]
    return "\n".join(parts)


def render_animation(name: str) -> str:
    """The player of docs/javascripts/animation.js around the recorded frames, inlined (the
    page then works from a file too); `<` is escaped so no frame can end the script early."""
    path = ROOT / "docs" / "animations" / f"{name}.json"
    if not path.exists():
        raise BookError(f"animation {name!r}: {path} is missing (python -m tools.animations)")
    data = json.loads(path.read_text())
    if len(data["frames"]) < 2:
        raise BookError(f"animation {name!r} has {len(data['frames'])} frame(s)")
    payload = path.read_text().replace("<", "\\u003c")
    width = figure_min_width(data["frames"][0]["svg"])
    buttons = "".join(
        f'<button type="button" data-act="{act}">{label}</button>'
        for act, label in (("first", "|◀ first"), ("prev", "◀ step"), ("play", "▶ play"),
                           ("next", "step ▶"), ("last", "last ▶|"))
    )  # fmt: skip
    return (
        f'<div class="book-animation" tabindex="0" role="group" aria-label="{data["title"]}" '
        f'data-animation="{name}" style="--book-figure-min: {width}px">'
        f'<script type="application/json">{payload}</script>'
        f'<div class="book-animation-stage"></div>'
        f'<p class="book-animation-narration" aria-live="polite"></p>'
        f'<div class="book-animation-controls">{buttons}'
        f'<span class="book-animation-counter"></span></div></div>'
    )


NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def chapter_frame(book: Book, chapter: Manifest, markdown: str) -> str:
    """A chapter's (or a project's) page gets, under its title, where it stands in the book,
    and at its end the commands that build and run its own tree (its package as it leaves it)."""
    settings = tomllib.loads((book.root / "chapters" / "book.toml").read_text())
    plan = settings.get("plan", [])
    chapters = [item for item in plan if str(item["number"]).isdigit()]
    if chapter.is_project:
        count = len(plan) - len(chapters)
        projects = NUMBER_WORDS[count] if count < len(NUMBER_WORDS) else str(count)
        cue = (f"*Project {chapter.label} of the book's {projects} projects, after the "
               f"{len(chapters)} chapters ([the roadmap](../roadmap.md)).*")  # fmt: skip
    else:
        cue = (f"*Chapter {chapter.label} of the {len(chapters)} chapters "
               f"([the roadmap](../roadmap.md)).*")  # fmt: skip
    lines = markdown.split("\n")
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if title is not None:
        lines[title + 1 : title + 1] = ["", cue]
    prints = next((i for i, line in enumerate(lines) if line == "## What it prints"), None)
    if prints is not None:
        where = (
            f"*The commands below run in {chapter.name}'s own tree, built as [Run this "
            f"{chapter.kind}](#run-this-{chapter.kind}) shows. Run from the repository's root, "
            f"the same main imports the finished package instead.*"
        )
        lines[prints + 1 : prints + 1] = ["", where]
    n, tree = chapter.arg, f"/tmp/{chapter.slug}"
    shown = [
        f"# build, run and test this {chapter.kind} alone",
        f"python tools/steps.py check {n}",
        "# or by hand: its tree, its main on its own package, its tests (check runs older ones)",
        f"python tools/steps.py build {n} --out {tree}",
        f"cd {tree}",
        f"python {chapter.main}",
        f"python -m pytest -q {' '.join(chapter.tests)}",
    ]
    footer = [
        "",
        f"## Run this {chapter.kind}",
        "",
        "From a clone of the book's repository, set up as [Get the code](../get-the-code.md) says:",
        "",
        "```bash",
        *shown,
        "```",
        "",
    ]
    return "\n".join(lines).rstrip("\n") + "\n" + "\n".join(footer)


def expand(markdown: str, page_path: str, book: Optional[Book] = None) -> str:
    book = book or Book(ROOT)
    depth = page_path.count("/")
    chapter = next((m for m in book.chapters if m.page == f"docs/{page_path}"), None)
    if chapter is not None and chapter.main:
        markdown = chapter_frame(book, chapter, markdown)
    try:
        markdown = CODE_RE.sub(
            lambda m: render_code(
                book, parse_chapter(m["chapter"]) if m["chapter"] else None, m["path"], m["symbol"]
            ),
            markdown,
        )
        markdown = TREE_RE.sub(lambda m: render_tree(book, parse_chapter(m["chapter"])), markdown)
        roadmap = render_roadmap(book)
        if depth:  # links in the table are relative to docs/
            roadmap = re.sub(r"\]\(([^)]+)\)", lambda m: f"]({'../' * depth}{m[1]})", roadmap)
        markdown = ROADMAP_RE.sub(lambda m: roadmap, markdown)
        markdown = READING_RE.sub(lambda m: render_reading_times(book, depth), markdown)
        markdown = PRINTS_RE.sub(fold_parity_table, markdown)
        markdown = CHALLENGES_RE.sub(lambda m: render_challenges(book, depth), markdown)
        markdown = ANIMATION_RE.sub(lambda m: render_animation(m["name"]), markdown)
        markdown = FIGURE_RE.sub(lambda m: render_figure(m, depth), markdown)
        if stray := STRAY_FIGURE_RE.search(markdown):
            raise BookError(
                f"{stray[1]}: a figure goes alone in its frame, its caption after it: "
                '<div class="book-figure" markdown>, the include, </div> (then it scrolls on '
                "a phone instead of shrinking its text below 12 px)"
            )
    except BookError as e:
        raise BookError(f"{page_path}: {e}") from e
    return markdown


_BOOK: Dict[str, Book] = {}


def on_page_markdown(markdown: str, page, config, files) -> str:  # mkdocs hook
    if "book" not in _BOOK:
        _BOOK["book"] = Book(ROOT)
    return expand(markdown, page.file.src_uri, _BOOK["book"])
