"""The book's plan as data: the chapters' manifests, and the trees they describe.

A chapter's manifest (``chapters/chNN/manifest.toml``) names the package files it creates,
modifies, or brings in early, its main, its tests, and the upstream files it follows. The
version of a file at chapter N is the one written by the latest chapter <= N that touched it:
its last version lives in ``minisgl/``, earlier ones in the folder of the chapter that wrote them.
``chapters/book.toml`` holds what every chapter shares (the support files copied into each
tree, the print tolerances, the whole plan).

After the numbered chapters come the projects P1, P2, ... (``chapters/p1/manifest.toml``, with
``chapter = "P1"``): the same kind of manifest, the same staged build. Inside the tools a
project has a number too, ``PROJECT_BASE + k``, so that it sorts after every chapter; a person
only ever sees its label ("P1"), as they see "07" for chapter 7 (`label_of`, `chapter_name`),
and every command line takes either (`parse_chapter`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from tools.prints import PrintRules

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parents[1]


# The last numbered chapter of the plan (chapters/book.toml; a test holds the two together).
# Project Pk is number PROJECT_BASE + k inside the tools, so the projects come after it in order.
PROJECT_BASE = 22
PROJECT_COUNT = 6  # P1 to P6


class BookError(Exception):
    """A manifest, a tree or a command line that cannot be used."""


class ChapterNameError(BookError, argparse.ArgumentTypeError):
    """Neither a chapter number nor a project (argparse shows its message as it is)."""


def is_project(number: int) -> bool:
    return number > PROJECT_BASE


def label_of(number: int) -> str:
    """What a person sees: "07" for chapter 7, "P1" for the first project."""
    return f"P{number - PROJECT_BASE}" if is_project(number) else f"{number:02d}"


def chapter_name(number: int) -> str:
    """The phrase in a sentence: "chapter 07", "project P1"."""
    return f"{'project' if is_project(number) else 'chapter'} {label_of(number)}"


def chapter_arg(number: int) -> str:
    """How a command line names it (what `parse_chapter` reads back): "7", "P1"."""
    return label_of(number) if is_project(number) else str(number)


def folder_of(number: int) -> str:
    """Its folder under chapters/, and the prefix of its files: "ch07", "p1"."""
    return label_of(number).lower() if is_project(number) else f"ch{label_of(number)}"


def parse_chapter(text: Union[str, int]) -> int:
    """A chapter as a person writes it ("7", "07", "P1", "p1") -> its number (7, 7, 23, 23);
    the `type=` of every command line argument that names a chapter."""
    text = str(text).strip()
    project = re.fullmatch(r"[Pp]([0-9]+)", text)
    if project and 1 <= int(project[1]) <= PROJECT_COUNT:
        return PROJECT_BASE + int(project[1])
    if re.fullmatch(r"[0-9]+", text) and int(text) <= PROJECT_BASE:
        return int(text)
    raise ChapterNameError(
        f"{text!r} names no chapter: a chapter is 0 to {PROJECT_BASE} (7 or 07), "
        f"a project P1 to P{PROJECT_COUNT} (or p1)"
    )


@dataclass
class Exercise:
    id: str
    file: str  # a path in the chapter's tree
    function: str  # "name" or "Class.method"
    tests: List[str]  # pytest node ids that must fail without the body
    hint: str = ""


@dataclass
class Manifest:
    number: int
    folder: Path
    title: str
    main: str
    tests: List[str] = field(default_factory=list)
    creates: List[str] = field(default_factory=list)
    modifies: List[str] = field(default_factory=list)
    early: List[str] = field(default_factory=list)
    upstream: List[str] = field(default_factory=list)
    retire: Dict[str, str] = field(default_factory=dict)
    exercises: List[Exercise] = field(default_factory=list)
    helpers: List[str] = field(default_factory=list)  # examples/helpers/ modules it introduces
    page: Optional[str] = None
    prints: PrintRules = field(default_factory=PrintRules)  # added to the book's rules
    parity: bool = True
    timeout: int = 600

    @property
    def label(self) -> str:
        return label_of(self.number)

    @property
    def name(self) -> str:
        return chapter_name(self.number)

    @property
    def arg(self) -> str:
        return chapter_arg(self.number)

    @property
    def slug(self) -> str:
        return folder_of(self.number)

    @property
    def is_project(self) -> bool:
        return is_project(self.number)

    @property
    def kind(self) -> str:
        return "project" if self.is_project else "chapter"

    @property
    def writes(self) -> List[str]:
        return [*self.creates, *self.modifies, *self.early]


def load_manifest(path: Path) -> Manifest:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise BookError(f"{path}: not valid TOML: {e}") from e
    known = {
        "chapter",
        "title",
        "main",
        "tests",
        "creates",
        "modifies",
        "early",
        "upstream",
        "retire",
        "exercise",
        "page",
        "prints",
        "parity",
        "timeout",
        "helpers",
    }
    unknown = set(data) - known
    if unknown:
        raise BookError(f"{path}: unknown keys {sorted(unknown)}")
    for key in ("chapter", "title", "main"):
        if key not in data:
            raise BookError(f"{path}: missing key {key!r}")
    exercises = [Exercise(**item) for item in data.get("exercise", [])]
    chapter = data["chapter"]
    if not isinstance(chapter, (int, str)) or isinstance(chapter, bool):
        raise BookError(f'{path}: chapter = {chapter!r}: a number, or a project such as "P1"')
    try:
        number = parse_chapter(chapter)
    except BookError as e:
        raise BookError(f"{path}: chapter = {chapter!r}: {e}") from e
    return Manifest(
        number=number,
        folder=path.parent,
        title=data["title"],
        main=data["main"],
        tests=list(data.get("tests", [])),
        creates=list(data.get("creates", [])),
        modifies=list(data.get("modifies", [])),
        early=list(data.get("early", [])),
        upstream=list(data.get("upstream", [])),
        retire=dict(data.get("retire", {})),
        exercises=exercises,
        helpers=list(data.get("helpers", [])),
        page=data.get("page"),
        prints=_print_rules(path, data.get("prints", {})),
        parity=bool(data.get("parity", True)),
        timeout=int(data.get("timeout", 600)),
    )


def _print_rules(path: Path, data: Dict) -> PrintRules:
    try:
        return PrintRules.from_toml(data)
    except TypeError as e:
        raise BookError(f"{path}: a [prints] rule has an unknown key: {e}") from e


class Book:
    """All chapters of one repository (the real one, or a fixture made by the tests)."""

    def __init__(self, root: Path = REPO_ROOT) -> None:
        self.root = Path(root).resolve()
        settings_path = self.root / "chapters" / "book.toml"
        if not settings_path.exists():
            raise BookError(f"{settings_path} is missing")
        settings = tomllib.loads(settings_path.read_text())
        self.package: str = settings.get("package", "minisgl")
        self.support: List[str] = list(settings.get("support", []))
        self.prints = _print_rules(settings_path, settings.get("prints", {}))
        manifests = [
            *(self.root / "chapters").glob("ch*/manifest.toml"),
            *(self.root / "chapters").glob("p*/manifest.toml"),
        ]
        self.chapters: List[Manifest] = sorted(
            (load_manifest(p) for p in manifests), key=lambda m: m.number
        )
        if not self.chapters:
            raise BookError("no chapters found under chapters/")
        numbers = [m.number for m in self.chapters]
        if len(set(numbers)) != len(numbers):
            labels = [m.label for m in self.chapters]
            raise BookError(f"two manifests claim the same chapter: {labels}")
        for m in self.chapters:
            if m.folder.name != m.slug:
                raise BookError(
                    f"{m.folder}/manifest.toml says {m.name}: its folder must be chapters/{m.slug}"
                )

    # ----------------------------------------------------------------- lookups
    def print_rules(self, chapter: Manifest) -> PrintRules:
        return self.prints + chapter.prints

    def chapter(self, number: int) -> Manifest:
        for m in self.chapters:
            if m.number == number:
                return m
        known = ", ".join(m.label for m in self.chapters)
        raise BookError(f"no {chapter_name(number)} in this book; it has {known}")

    @property
    def last(self) -> Manifest:
        return self.chapters[-1]

    def writers(self, path: str) -> List[Manifest]:
        return [m for m in self.chapters if path in m.writes]

    def stored_at(self, path: str, writer: Manifest) -> Path:
        """Where the version of `path` written by chapter `writer` lives."""
        later = [m for m in self.writers(path) if m.number > writer.number]
        return self.root / path if not later else writer.folder / path

    def package_files(self, number: int) -> Dict[str, Path]:
        """Package path -> the file holding its version at chapter `number`."""
        files: Dict[str, Path] = {}
        for m in self.chapters:
            if m.number > number:
                break
            for path in m.writes:
                files[path] = self.stored_at(path, m)
        return files

    def previous(self, number: int) -> Optional[Manifest]:
        earlier = [m for m in self.chapters if m.number < number]
        return earlier[-1] if earlier else None

    def changed_files(self, before: Optional[int], after: int) -> List[str]:
        """Package files that differ between two chapters' trees (added, removed or edited);
        every file of `after` when `before` is None."""
        new = self.package_files(after)
        if before is None:
            return sorted(new)
        old = self.package_files(before)
        return sorted(
            path
            for path in set(old) | set(new)
            if path not in old
            or path not in new
            or old[path].read_bytes() != new[path].read_bytes()
        )

    def tests_at(self, number: int) -> List[str]:
        retired = {t for m in self.chapters if m.number <= number for t in m.retire}
        return [t for m in self.chapters if m.number <= number for t in m.tests if t not in retired]

    def retired_tests(self) -> Dict[str, Tuple[int, str]]:
        return {t: (m.number, why) for m in self.chapters for t, why in m.retire.items()}

    def creator_of(self, path: str) -> Optional[Manifest]:
        for m in self.chapters:
            if path in m.creates or path in m.early:
                return m
        return None

    # ------------------------------------------------------------------ build
    def build(self, number: int, out: Path) -> Path:
        """Materialise chapter `number`'s tree into `out` (which must be empty or absent)."""
        out = Path(out)
        if out.exists() and any(out.iterdir()):
            raise BookError(f"{out} is not empty")
        chapter = self.chapter(number)  # an unknown chapter fails before anything is made
        out.mkdir(parents=True, exist_ok=True)
        for rel, src in self.package_files(number).items():
            _copy(src, out / rel)
        for rel in self.support:
            src = self.root / rel
            if src.is_dir():
                for f in sorted(src.rglob("*")):
                    if f.is_file() and "__pycache__" not in f.parts:
                        _copy(f, out / f.relative_to(self.root))
            elif src.exists():
                _copy(src, out / rel)
        for m in self.chapters:
            if m.number <= chapter.number:
                for rel in [m.main, *m.helpers]:
                    if (self.root / rel).exists():
                        _copy(self.root / rel, out / rel)
        for rel in self.tests_at(number):
            _copy(self.root / rel, out / rel)
        return out

    # --------------------------------------------------------- manifest truth
    def verify(self) -> List[str]:
        """Every way the manifests and the files on disk can disagree, as sentences."""
        problems: List[str] = []
        existing: Dict[str, Manifest] = {}
        version: Dict[str, Path] = {}
        for m in self.chapters:
            seen: Dict[str, str] = {}
            for kind, paths in (
                ("creates", m.creates),
                ("modifies", m.modifies),
                ("early", m.early),
            ):
                for path in paths:
                    if path in seen:
                        problems.append(f"{m.name} names {path} twice ({seen[path]}, {kind})")
                    seen[path] = kind
                    if not path.startswith(self.package + "/"):
                        problems.append(f"{m.name} {kind} {path}, outside {self.package}/")
                    if kind in ("creates", "early") and path in existing:
                        problems.append(
                            f"{m.name} says it {kind} {path}, but "
                            f"{existing[path].name} already wrote it"
                        )
                    if kind == "modifies" and path not in existing:
                        problems.append(
                            f"{m.name} says it modifies {path}, which no earlier chapter wrote"
                        )
                    stored = self.stored_at(path, m)
                    if not stored.exists():
                        problems.append(
                            f"{m.name} writes {path}, but {_rel(stored, self.root)} is missing"
                        )
                    elif kind == "modifies" and path in version and version[path].exists():
                        if stored.read_bytes() == version[path].read_bytes():
                            problems.append(
                                f"{m.name} says it modifies {path}, but its version is "
                                f"identical to {existing[path].name}'s"
                            )
                    existing[path], version[path] = m, stored
            # the chapter folder holds exactly its non-final versions and the manifest
            expected = {path for path in m.writes if self.stored_at(path, m) == m.folder / path}
            present = {
                str(p.relative_to(m.folder)).replace(os.sep, "/")
                for p in m.folder.rglob("*")
                if p.is_file() and p.name != "manifest.toml" and "__pycache__" not in p.parts
            }
            for extra in sorted(present - expected):
                why = (
                    "its last version belongs in the package folder"
                    if extra in m.writes
                    else "the manifest does not name it"
                )
                problems.append(f"chapters/{m.folder.name}/{extra} should not be there: {why}")
            if not (self.root / m.main).exists():
                problems.append(f"{m.name}'s main {m.main} is missing")
            for t in m.tests:
                if not (self.root / t).exists():
                    problems.append(f"{m.name}'s test file {t} is missing")
                elif not Path(t).name.startswith(f"test_{m.slug}_"):
                    problems.append(f"{m.name}'s test file {t} should be named test_{m.slug}_*.py")
            for t, why in m.retire.items():
                if not why.strip():
                    problems.append(f"{m.name} retires {t} without a reason")
                if not any(
                    t in earlier.tests for earlier in self.chapters if earlier.number < m.number
                ):
                    problems.append(f"{m.name} retires {t}, which no earlier chapter runs")
            if m.page and not (self.root / m.page).exists():
                problems.append(f"{m.name}'s page {m.page} is missing")
        # the finished package is exactly the last chapter's tree
        final = set(self.package_files(self.last.number))
        package_dir = self.root / self.package
        on_disk = (
            {
                str(p.relative_to(self.root)).replace(os.sep, "/")
                for p in package_dir.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
            }
            if package_dir.exists()
            else set()
        )
        for extra in sorted(on_disk - final):
            problems.append(f"{extra} is in {self.package}/, but no chapter's manifest writes it")
        for missing in sorted(final - on_disk):
            problems.append(
                f"{missing} belongs to the last chapter's tree but is not in {self.package}/"
            )
        # every helper module belongs to exactly one chapter
        helpers = [h for m in self.chapters for h in m.helpers]
        for h in sorted({h for h in helpers if helpers.count(h) > 1}):
            problems.append(f"{h} is a helper of more than one chapter")
        for h in helpers:
            if not (self.root / h).exists():
                problems.append(f"the helper {h} is missing")
        helpers_dir = self.root / "examples" / "helpers"
        for f in sorted(helpers_dir.rglob("*.py")) if helpers_dir.exists() else []:
            rel = f.relative_to(self.root).as_posix()
            if rel not in helpers and "__pycache__" not in f.parts:
                problems.append(f"{rel} is not named by any chapter's manifest (helpers)")
        # every chapter test file on disk belongs to a manifest
        claimed = {t for m in self.chapters for t in m.tests}
        tests = self.root / "tests"
        for f in sorted([*tests.glob("test_ch*.py"), *tests.glob("test_p[0-9]*.py")]):
            rel = f"tests/{f.name}"
            if rel not in claimed:
                problems.append(f"{rel} is not named by any chapter's manifest")
        return problems


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
