"""`python tools/steps.py new N SLUG [--modifies FILE ...] [--creates FILE ...]`: open chapter N
(or project Pk: ``chapters/pk/``, ``examples/pk_SLUG.py``, ``tests/test_pk_SLUG.py``).

What it does, so that the tree of every earlier chapter stays as it was:

* each file the chapter will modify keeps its current version for the chapter that wrote it
  last: the file moves from ``minisgl/`` to that chapter's folder, and ``minisgl/`` keeps a
  copy that the new chapter now edits;
* each file it creates gets an empty module with a docstring to fill in;
* it writes ``chapters/chNN/manifest.toml`` (title and summary from ``chapters/book.toml``'s
  plan), a main, a test file and a page, each a skeleton that says what to write.

`steps.py check` fails until the chapter is written: a "modifies" file identical to its
previous version, a page with no "what it prints" block and a main with no parity line are
all reported.
"""

from __future__ import annotations

import shutil
from typing import List, Sequence

from tools.book import (
    Book,
    BookError,
    chapter_arg,
    chapter_name,
    folder_of,
    is_project,
    label_of,
    tomllib,
)


def _plan_entry(book: Book, number: int) -> dict:
    settings = tomllib.loads((book.root / "chapters" / "book.toml").read_text())
    for item in settings.get("plan", []):
        if item["number"] == label_of(number):
            return item
    raise BookError(f"chapters/book.toml's plan has no {chapter_name(number)}")


def _toml_list(items: Sequence[str]) -> str:
    return "[" + "".join(f'\n    "{item}",' for item in items) + ("\n]" if items else "]")


def open_chapter(
    book: Book, number: int, slug: str, modifies: Sequence[str], creates: Sequence[str]
) -> List[str]:
    """Do it; return what was done, one line each. Every argument is checked before anything
    is written: a refused call leaves the book as it was."""
    name, label, prefix = chapter_name(number), label_of(number), folder_of(number)
    if any(m.number == number for m in book.chapters):
        raise BookError(f"{name} exists already")
    if number < book.last.number:
        raise BookError(f"{name} would come before {book.last.name}, the last one")
    folder = book.root / "chapters" / prefix
    entry = _plan_entry(book, number)
    final = book.package_files(book.last.number)
    main = f"examples/{prefix}_{slug}.py"
    test = f"tests/test_{prefix}_{slug}.py"
    page = f"docs/chapters/{prefix}-{slug}.md"
    named = name[0].upper() + name[1:]  # "Chapter 07", "Project P1"
    for path in modifies:
        if path not in final:
            raise BookError(f"{path} is not in the last chapter's tree: it cannot be modified")
    for path in creates:
        if (book.root / path).exists() or path in final:
            raise BookError(f"{path} exists already: list it under --modifies")
    for path in (main, test, page):
        if (book.root / path).exists():
            raise BookError(f"{path} exists already")
    done: List[str] = []
    for path in modifies:
        writer = book.writers(path)[-1]
        kept = writer.folder / path
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(book.root / path, kept)
        done.append(f"kept {writer.name}'s {path} in {kept.relative_to(book.root)}")
    for path in creates:
        target = book.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f'"""({name}: say what this module holds)"""\n')
        done.append(f"created {path}")
    skeletons = {
        main: f'"""{named}: {entry["title"]}. (What the main shows; it ends with the '
        f'parity check.)"""\n\nimport sys\n\nif __name__ == "__main__":\n'
        f'    sys.exit("{name}\'s main is not written yet")\n',
        test: f'"""{named}: {entry["title"]}."""\n\n\ndef test_not_written_yet() -> None:\n'
        f'    raise AssertionError("{name}\'s tests are not written yet")\n',
        page: f"# {label} · {entry['title']}\n\n{entry['summary']}.\n\n## Files so far\n\n"
        f"<!-- tree[{chapter_arg(number)}] -->\n\n## What it prints\n\n<!-- prints: {main} -->\n"
        "```text\n```\n",
    }
    for path, text in skeletons.items():
        target = book.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        done.append(f"wrote the skeleton {path}")
    folder.mkdir(parents=True, exist_ok=True)
    chapter_value = f'"{label}"' if is_project(number) else str(number)  # 7 or "P1"
    manifest = (
        f'chapter = {chapter_value}\ntitle = "{entry["title"]}"\npage = "{page}"\nmain = "{main}"\n'
        f'tests = ["{test}"]\ncreates = {_toml_list(creates)}\nmodifies = {_toml_list(modifies)}\n'
        f"upstream = []  # the upstream files this chapter follows, as python/minisgl/...\n"
    )
    (folder / "manifest.toml").write_text(manifest)
    done.append(f"wrote chapters/{prefix}/manifest.toml")
    if (book.root / "mkdocs.yml").exists() and book.last.page:
        done.append(_add_to_nav(book, number, entry["title"], page))
    return done


def _add_to_nav(book: Book, number: int, title: str, page: str) -> str:
    """Put the page in mkdocs.yml's nav, after the last chapter's page."""
    mkdocs = book.root / "mkdocs.yml"
    lines = mkdocs.read_text().splitlines(keepends=True)
    last_page = book.last.page or ""
    at = max(i for i, line in enumerate(lines) if last_page.removeprefix("docs/") in line)
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at + 1, f'{indent}- "{label_of(number)} {title}": {page.removeprefix("docs/")}\n')
    mkdocs.write_text("".join(lines))
    return "added the page to mkdocs.yml's nav"
