"""tools/book_hooks.py: what the site adds to a chapter's page, from the manifests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools.book import Book, BookError
from tools.book_hooks import ANIMATION_RE, expand
from tools.figures import FIGURES

ROOT = Path(__file__).resolve().parents[1]
BOOK = Book(ROOT)


def test_an_exercised_function_is_folded_and_other_code_is_not() -> None:
    chapter = next(m for m in BOOK.chapters if m.exercises and m.page)
    ex = chapter.exercises[0]
    shown = expand(f"<!-- code[{chapter.number}]: {ex.file}::{ex.function} -->\n", "x.md", BOOK)
    assert shown.startswith('??? example "') and f"`{ex.id}`" in shown
    assert "\n    ```python" in shown  # the listing, inside the folded block
    other = expand(f"<!-- code[{chapter.number}]: {ex.file} -->\n", "x.md", BOOK)
    assert other.startswith("??? example")  # the whole file holds the solution too
    plain = expand("<!-- code[1]: minisgl/core.py::SamplingParams -->\n", "x.md", BOOK)
    assert plain.startswith("```python")


def test_the_package_tree_is_folded_with_a_summary() -> None:
    shown = expand("<!-- tree[15] -->\n", "x.md", BOOK)
    assert shown.startswith('??? abstract "The whole package after this chapter: ')
    assert "of them created or changed here" in shown and "<- created" in shown


def test_a_chapter_page_says_where_it_stands_and_how_to_run_its_tree() -> None:
    chapter = BOOK.chapter(15)
    page = chapter.page.removeprefix("docs/")
    shown = expand("# 15 · API server\n\nText.\n\n## What it prints\n\nRun it.\n", page, BOOK)
    lines = shown.split("\n")
    assert lines[0] == "# 15 · API server" and lines[2].startswith("*Chapter 15 of the 23 ")
    assert "## Run this chapter" in shown
    assert "own tree, built as [Run this chapter](#run-this-chapter) shows" in shown
    assert "python tools/steps.py build 15 --out /tmp/ch15" in shown
    assert f"python {chapter.main}" in shown and chapter.tests[0] in shown
    assert "Run this chapter" not in expand("# Home\n", "index.md", BOOK)


def test_every_parity_table_is_folded_under_its_summary_and_nothing_is_lost() -> None:
    folded = 0
    for chapter in BOOK.chapters:
        if not chapter.page:
            continue
        source = (ROOT / chapter.page).read_text()
        # the animations' frames are recorded by a build; they have their own tests
        shown = expand(ANIMATION_RE.sub("", source), chapter.page.removeprefix("docs/"), BOOK)
        for line in source.split("\n"):
            if line.startswith("parity: models="):
                models, prompts = line.split()[1:3]
                title = f"{models.split('=')[1]} models x {prompts.split('=')[1]} prompts"
                assert f'??? success "Parity with transformers: {title}' in shown, chapter.page
                assert f"\n    {line}\n" in shown  # the summary line itself, inside the fold
                folded += 1
        table = [line for line in source.split("\n") if line.startswith("tiny-qwen3  ")]
        assert all(line.rstrip() in shown for line in table)
    assert folded >= 15  # chapters 00-15: one parity table each


def test_a_figure_keeps_its_text_legible_and_links_to_its_file() -> None:
    page = '<div class="book-figure" markdown>\n--8<-- "docs/figures/ch09-tree.svg"\n</div>\n'
    shown = expand(page, "chapters/ch09-radix.md", BOOK)
    svg = FIGURES["ch09-tree"]()
    smallest = min(float(v) for v in re.findall(r'font-size="([\d.]+)"', svg))
    width = int(re.search(r"--book-figure-min: (\d+)px", shown)[1])
    assert abs(width * smallest / 940 - 12) < 0.02  # 940: the figure's viewBox width
    assert "[Open the figure full size](../figures/ch09-tree.svg)" in shown


def test_a_figure_with_its_caption_inside_its_frame_is_refused() -> None:
    """Framed any other way, the figure would shrink on a phone (chapter 18's first draft)."""
    include = '--8<-- "docs/figures/ch09-tree.svg"'
    page = f'<div class="book-figure" markdown>\n{include}\n\n*A caption.*\n</div>\n'
    with pytest.raises(BookError, match="a figure goes alone in its frame"):
        expand(page, "chapters/ch09-radix.md", BOOK)


def test_a_changed_function_shows_its_changed_lines_and_a_diff_from_both_versions() -> None:
    shown = expand(
        "<!-- code[11]: minisgl/scheduler/scheduler.py::Scheduler.__init__ -->\n", "x.md"
    )
    head = shown.split("\n")[0]
    assert "highlighted: changed since chapter 10" in head
    spans = re.search(r'hl_lines="([\d\- ]+)"', head)[1].split()
    body = shown.split("\n")[1:]
    first_changed = int(spans[0].split("-")[0])
    assert "self.stream = dev.Stream" in "\n".join(body[first_changed - 1 : first_changed + 2])
    assert "--- chapter 10\n    +++ chapter 11" in shown
    assert "\n    +        self.stream = dev.Stream(self.device)" in shown
    unchanged = expand("<!-- code[11]: minisgl/core.py::SamplingParams -->\n", "x.md", BOOK)
    assert "hl_lines" not in unchanged and "What changed" not in unchanged


def test_reading_times_are_counted_from_the_pages() -> None:
    shown = expand("<!-- reading-times -->\n", "how-to-read.md", BOOK)
    words = len((ROOT / BOOK.chapter(0).page).read_text().split())
    assert f"| Start | 00 | {words:,} | " in shown
    projects = [m for m in BOOK.chapters if m.is_project and m.page]
    if not projects:
        assert "| Projects | P1 to P6 | not written yet | |" in shown
    else:  # counted like the chapters (the fixture book's test checks how)
        assert "| Projects | P1 to P6 | " in shown and f"({len(projects)} of 6 written)" in shown
    total = sum(len((ROOT / m.page).read_text().split()) for m in BOOK.chapters if m.page)
    assert f"The written chapters come to {total:,} words" in shown


def test_the_length_the_text_gives_step0_is_its_length() -> None:
    """README, the home page and chapter 00 say how long step 0 is, and where its check begins."""
    lines = (ROOT / "examples" / "ch00_step0.py").read_text().splitlines()
    check_starts = next(i for i, line in enumerate(lines) if line.startswith("def check("))
    engine = len(lines[:check_starts]) - 2  # the two blank lines before `def check`
    page = (ROOT / "docs" / "chapters" / "ch00-step0.md").read_text()
    assert f"`examples/ch00_step0.py`, {len(lines)} lines." in page
    assert f"The first {engine} are an" in page and f"The last {len(lines) - engine} check" in page
    assert f"a single file of {len(lines)} lines" in (ROOT / "docs" / "index.md").read_text()
    assert f"a {len(lines)}-line engine" in (ROOT / "README.md").read_text()


def test_a_project_page_says_where_it_stands_and_how_to_run_its_tree(tmp_path: Path) -> None:
    """On a small book of chapters 00 to 02 and project P1 (tests/test_tools_steps.py)."""
    from tests.test_tools_steps import make_project_book

    book = Book(make_project_book(tmp_path))
    project = book.last
    shown = expand((tmp_path / "docs" / "p1.md").read_text(), "p1.md", book)
    lines = shown.split("\n")
    assert lines[0] == "# P1 · project 1" and lines[2] == (
        "*Project P1 of the book's six projects, after the 3 chapters "
        "([the roadmap](../roadmap.md)).*"
    )
    assert "## Run this project" in shown and "## Run this chapter" not in shown
    assert "run in project P1's own tree, built as [Run this project](#run-this-project)" in shown
    assert "python tools/steps.py check P1\n" in shown
    assert "python tools/steps.py build P1 --out /tmp/p1\ncd /tmp/p1\n" in shown
    assert f"python -m pytest -q {project.tests[0]}" in shown
    # its tree and its code, by the project's label
    assert '??? abstract "The whole package after this project: 4 files (2 of them' in shown
    assert re.search(r"\n {8}quad\.py +<- created\n {8}util\.py +<- modified\n", shown)
    assert '```python title="minisgl/util.py (project P1), new since chapter 02"' in shown
    changed = expand("<!-- code[p1]: minisgl/util.py::triple -->\n", "x.md", book)
    assert changed.startswith('```python title="minisgl/util.py (project P1)" linenums="1"')
    with pytest.raises(BookError, match="'P7' names no chapter"):
        expand("<!-- tree[P7] -->\n", "x.md", book)
    # a chapter's page in the same book keeps its cue
    chapter = expand("# One\n\nText.\n", "ch01.md", book).split("\n")
    assert chapter[2] == "*Chapter 01 of the 3 chapters ([the roadmap](../roadmap.md)).*"


def test_a_written_project_is_linked_on_the_roadmap_and_counted_in_the_reading_times(
    tmp_path: Path,
) -> None:
    from tests.test_tools_steps import make_project_book

    book = Book(make_project_book(tmp_path))
    for page in ("architecture.md", "machinery.md"):  # the overview pages, counted too
        (tmp_path / "docs" / page).write_text("# Overview\n")
    roadmap = expand("<!-- roadmap -->\n", "roadmap.md", book)
    assert "| P1 | [project 1](p1.md) | project 1, in short | written |" in roadmap
    assert "| P2 | project 2 | project 2, in short | not yet written |" in roadmap
    assert "| 01 | [one](ch01.md) | one, in short | written |" in roadmap
    words = len((tmp_path / "docs" / "p1.md").read_text().split())
    times = expand("<!-- reading-times -->\n", "how-to-read.md", book)
    assert f"| Projects | P1 to P6 | {words:,} (1 of 6 written) | 5 min |" in times
