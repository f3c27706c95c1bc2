"""The staged build: every chapter's tree, built and checked on its own.

    python tools/steps.py list                 the chapters and what each one writes
    python tools/steps.py build N --out DIR    chapter N's tree (package, mains, tests) in DIR
    python tools/steps.py check [N ...]        build, run and test chapters in isolation
    python tools/steps.py diff N M             how the package changed from chapter N to M
    python tools/steps.py prints N [--write]   compare (or refresh) the "what it prints" block

A chapter's manifest (``chapters/chNN/manifest.toml``) names the package files it creates,
modifies, or brings in early, its main, its tests, and the upstream files it follows. The
version of a file at chapter N is the one written by the latest chapter <= N that touched it:
its last version lives in ``minisgl/``, earlier ones in the folder of the chapter that wrote them.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parents[1]
PARITY_RE = re.compile(
    r"^parity: models=(?P<models>\d+) prompts=(?P<prompts>\d+) "
    r"tokens=(?P<matched>\d+)/(?P<total>\d+) min_margin=(?P<margin>[-\d.e+inf]+)",
    re.MULTILINE,
)
PRINTS_RE = re.compile(r"<!-- prints: (?P<main>\S+) -->\s*\n```text\n(?P<body>.*?)```", re.DOTALL)
MISSING_MODULE_RE = re.compile(r"No module named '(?P<module>[\w.]+)'")
MISSING_NAME_RE = re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>[\w.]+)'")


class BookError(Exception):
    """A manifest, a tree or a command line that cannot be used."""


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
    page: Optional[str] = None
    mask: List[str] = field(default_factory=list)
    parity: bool = True
    timeout: int = 600

    @property
    def label(self) -> str:
        return f"{self.number:02d}"

    @property
    def writes(self) -> List[str]:
        return [*self.creates, *self.modifies, *self.early]


def _load_manifest(path: Path) -> Manifest:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise BookError(f"{path}: not valid TOML: {e}") from e
    known = {
        "chapter", "title", "main", "tests", "creates", "modifies", "early", "upstream",
        "retire", "exercise", "page", "prints", "parity", "timeout",
    }  # fmt: skip
    unknown = set(data) - known
    if unknown:
        raise BookError(f"{path}: unknown keys {sorted(unknown)}")
    for key in ("chapter", "title", "main"):
        if key not in data:
            raise BookError(f"{path}: missing key {key!r}")
    exercises = [Exercise(**item) for item in data.get("exercise", [])]
    return Manifest(
        number=int(data["chapter"]),
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
        page=data.get("page"),
        mask=list(data.get("prints", {}).get("mask", [])),
        parity=bool(data.get("parity", True)),
        timeout=int(data.get("timeout", 600)),
    )


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
        manifests = sorted((self.root / "chapters").glob("ch*/manifest.toml"))
        self.chapters: List[Manifest] = sorted(
            (_load_manifest(p) for p in manifests), key=lambda m: m.number
        )
        if not self.chapters:
            raise BookError("no chapters found under chapters/")
        numbers = [m.number for m in self.chapters]
        if len(set(numbers)) != len(numbers):
            raise BookError(f"two manifests claim the same chapter number: {numbers}")
        for m in self.chapters:
            if m.folder.name != f"ch{m.label}":
                raise BookError(f"{m.folder}/manifest.toml says chapter {m.number}")

    # ----------------------------------------------------------------- lookups
    def chapter(self, number: int) -> Manifest:
        for m in self.chapters:
            if m.number == number:
                return m
        raise BookError(f"no chapter {number}; chapters: {[m.number for m in self.chapters]}")

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

    def tests_at(self, number: int) -> List[str]:
        retired = {t for m in self.chapters if m.number <= number for t in m.retire}
        return [
            t for m in self.chapters if m.number <= number for t in m.tests if t not in retired
        ]

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
        out.mkdir(parents=True, exist_ok=True)
        chapter = self.chapter(number)
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
            if m.number <= chapter.number and (self.root / m.main).exists():
                _copy(self.root / m.main, out / m.main)
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
            for kind, paths in (("creates", m.creates), ("modifies", m.modifies), ("early", m.early)):
                for path in paths:
                    if path in seen:
                        problems.append(f"chapter {m.label} names {path} twice ({seen[path]}, {kind})")
                    seen[path] = kind
                    if not path.startswith(self.package + "/"):
                        problems.append(f"chapter {m.label} {kind} {path}, outside {self.package}/")
                    if kind in ("creates", "early") and path in existing:
                        problems.append(
                            f"chapter {m.label} says it {kind} {path}, but chapter "
                            f"{existing[path].label} already wrote it"
                        )
                    if kind == "modifies" and path not in existing:
                        problems.append(
                            f"chapter {m.label} says it modifies {path}, which no earlier chapter wrote"
                        )
                    stored = self.stored_at(path, m)
                    if not stored.exists():
                        problems.append(f"chapter {m.label} writes {path}, but {_rel(stored, self.root)} is missing")
                    elif kind == "modifies" and path in version and version[path].exists():
                        if stored.read_bytes() == version[path].read_bytes():
                            problems.append(
                                f"chapter {m.label} says it modifies {path}, but its version is "
                                f"identical to chapter {existing[path].label}'s"
                            )
                    existing[path], version[path] = m, stored
            # the chapter folder holds exactly its non-final versions and the manifest
            expected = {
                path for path in m.writes if self.stored_at(path, m) == m.folder / path
            }
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
                problems.append(f"chapter {m.label}'s main {m.main} is missing")
            for t in m.tests:
                if not (self.root / t).exists():
                    problems.append(f"chapter {m.label}'s test file {t} is missing")
                elif not Path(t).name.startswith(f"test_ch{m.label}_"):
                    problems.append(f"chapter {m.label}'s test file {t} should be named test_ch{m.label}_*.py")
            for t, why in m.retire.items():
                if not why.strip():
                    problems.append(f"chapter {m.label} retires {t} without a reason")
                if not any(t in earlier.tests for earlier in self.chapters if earlier.number < m.number):
                    problems.append(f"chapter {m.label} retires {t}, which no earlier chapter runs")
            if m.page and not (self.root / m.page).exists():
                problems.append(f"chapter {m.label}'s page {m.page} is missing")
        # the finished package is exactly the last chapter's tree
        final = set(self.package_files(self.last.number))
        package_dir = self.root / self.package
        on_disk = {
            str(p.relative_to(self.root)).replace(os.sep, "/")
            for p in package_dir.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
        } if package_dir.exists() else set()  # fmt: skip
        for extra in sorted(on_disk - final):
            problems.append(f"{extra} is in {self.package}/, but no chapter's manifest writes it")
        for missing in sorted(final - on_disk):
            problems.append(f"{missing} belongs to the last chapter's tree but is not in {self.package}/")
        # every chapter test file on disk belongs to a manifest
        claimed = {t for m in self.chapters for t in m.tests}
        for f in sorted((self.root / "tests").glob("test_ch*.py")):
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


# ------------------------------------------------------------------ isolation
GUARD = '''\
"""Written by tools/steps.py: keep a chapter's run inside its own tree."""
import atexit, importlib.machinery, os, sys

_TREE = os.path.realpath(os.environ["MINISGL_BOOK_TREE"])
_PKG = os.environ.get("MINISGL_BOOK_PACKAGE", "minisgl")
_CHAPTER = os.environ.get("MINISGL_BOOK_CHAPTER", "?")

# an editable install of the repository must not serve the package
sys.meta_path[:] = [f for f in sys.meta_path if _PKG not in type(f).__module__]
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") == _TREE
               or not os.path.exists(os.path.join(p or ".", _PKG, "__init__.py"))]


class _TreeOnly:
    """Find the top-level package in the chapter's tree and nowhere else."""

    def find_spec(self, name, path=None, target=None):
        if name != _PKG:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [_TREE])
        if spec is None:
            raise ModuleNotFoundError(
                f"No module named '{name}' (chapter {_CHAPTER}'s tree has no {name}/)", name=name)
        return spec


sys.meta_path.insert(0, _TreeOnly())


def _no_leaks():
    for mod_name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if (mod_name == _PKG or mod_name.startswith(_PKG + ".")) and file:
            if not os.path.realpath(file).startswith(_TREE + os.sep):
                sys.stderr.write(f"steps.py: {mod_name} was loaded from {file}, outside the tree\\n")
                sys.stderr.flush()
                os._exit(86)


atexit.register(_no_leaks)
'''


def _isolated_env(
    book: Book, number: int, tree: Path, guard_dir: Path, threads: Optional[int] = None
) -> Dict[str, str]:
    guard_dir.mkdir(parents=True, exist_ok=True)
    (guard_dir / "sitecustomize.py").write_text(GUARD)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(guard_dir), str(tree)]),
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        MINISGL_BOOK_TREE=str(tree),
        MINISGL_BOOK_PACKAGE=book.package,
        MINISGL_BOOK_CHAPTER=str(number),
    )
    if threads is not None:  # chapters checked side by side: one core each, no oversubscription
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


# ---------------------------------------------------------------------- check
@dataclass
class Parity:
    models: int
    prompts: int
    matched: int
    total: int
    margin: float

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.matched == self.total

    def __str__(self) -> str:
        return f"{self.models} x {self.prompts}, {self.matched}/{self.total}"


def parse_parity(stdout: str) -> Optional[Parity]:
    found = PARITY_RE.findall(stdout)
    if not found:
        return None
    match = list(PARITY_RE.finditer(stdout))[-1]
    return Parity(
        models=int(match["models"]),
        prompts=int(match["prompts"]),
        matched=int(match["matched"]),
        total=int(match["total"]),
        margin=float(match["margin"]),
    )


@dataclass
class Row:
    chapter: Manifest
    files: int = 0
    main_ok: bool = False
    passed: int = 0
    failed: int = 0
    parity: Optional[Parity] = None
    seconds: float = 0.0
    problems: List[str] = field(default_factory=list)
    stdout: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def mask_output(text: str, patterns: Sequence[str]) -> str:
    """Replace what varies from run to run by "#": each pattern's group named "v" if it has
    one, else its whole match."""
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    masked = "\n".join(lines)

    def replace(match: re.Match) -> str:
        if "v" not in match.re.groupindex:
            return "#"
        start, end = match.span("v")
        whole_start = match.start()
        return match.group(0)[: start - whole_start] + "#" + match.group(0)[end - whole_start :]

    for pattern in patterns:
        masked = re.sub(pattern, replace, masked, flags=re.MULTILINE)
    return masked


def prints_blocks(book: Book, chapter: Manifest) -> List[re.Match]:
    if not chapter.page or not (book.root / chapter.page).exists():
        return []
    text = (book.root / chapter.page).read_text()
    return [b for b in PRINTS_RE.finditer(text) if b["main"] == chapter.main]


def stale_prints(book: Book, chapter: Manifest, stdout: str) -> List[str]:
    problems = []
    fresh = mask_output(stdout, chapter.mask)
    blocks = prints_blocks(book, chapter)
    if chapter.page and (book.root / chapter.page).exists() and not blocks:
        problems.append(f"{chapter.page} shows no '<!-- prints: {chapter.main} -->' block")
    for block in blocks:
        shown = mask_output(block["body"], chapter.mask)
        if shown != fresh:
            diff = "\n".join(
                difflib.unified_diff(
                    shown.splitlines(), fresh.splitlines(), "in the page", "the main now", lineterm=""
                )
            )
            problems.append(
                f"the 'what it prints' block in {chapter.page} is stale "
                f"(refresh it with: python tools/steps.py prints {chapter.number} --write):\n{diff}"
            )
    return problems


def explain_import_failure(book: Book, number: int, stderr: str) -> List[str]:
    """Turn an import error into a sentence that names the chapter owning the module."""
    notes = []
    for m in MISSING_MODULE_RE.finditer(stderr):
        module = m["module"]
        if module.split(".")[0] != book.package:
            continue
        rel = module.replace(".", "/")
        for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
            owner = book.creator_of(candidate)
            if owner is not None and owner.number > number:
                notes.append(
                    f"chapter {number:02d} imports {module}, which only chapter {owner.label} creates: "
                    f"a chapter may use only the files of its own tree (bring the file in early, "
                    f"or move the code to chapter {owner.label})"
                )
                break
        else:
            notes.append(f"chapter {number:02d} imports {module}, which no chapter up to it has")
    for m in MISSING_NAME_RE.finditer(stderr):
        if m["module"].split(".")[0] == book.package:
            notes.append(
                f"chapter {number:02d} imports {m['name']} from {m['module']}, which that "
                f"module's version at chapter {number:02d} does not define"
            )
    return notes


def _junit_counts(path: Path) -> Tuple[int, int]:
    if not path.exists():
        return 0, 0
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = failed = 0
    for s in suites:
        tests, fails = int(s.get("tests", 0)), int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped = int(s.get("skipped", 0))
        total += tests - skipped
        failed += fails
    return total - failed, failed


def run_chapter(
    book: Book,
    number: int,
    keep: Optional[Path] = None,
    verbose: bool = False,
    run_tests: bool = True,
    check_prints: bool = True,
    threads: Optional[int] = None,
) -> Row:
    chapter = book.chapter(number)
    row = Row(chapter)
    begin = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f"minisgl-ch{chapter.label}-"))
    try:
        tree = book.build(number, work / "tree")
        row.files = len(book.package_files(number))
        env = _isolated_env(book, number, tree, work / "guard", threads)
        main = subprocess.run(
            [sys.executable, chapter.main],
            cwd=tree, env=env, capture_output=True, text=True, timeout=chapter.timeout,
        )  # fmt: skip
        row.stdout = main.stdout
        row.main_ok = main.returncode == 0
        if verbose:
            sys.stdout.write(main.stdout)
        if not row.main_ok:
            notes = explain_import_failure(book, number, main.stderr)
            tail = "\n".join(main.stderr.strip().splitlines()[-15:])
            row.problems.append(
                f"main {chapter.main} exited with {main.returncode}"
                + "".join(f"\n  {n}" for n in notes)
                + (f"\n  --- last lines of its stderr ---\n{tail}" if tail else "")
                + (f"\n  --- its stdout ---\n{main.stdout[-3000:]}" if main.stdout.strip() else "")
            )
        if chapter.parity:
            row.parity = parse_parity(main.stdout)
            if row.parity is None:
                if row.main_ok:
                    row.problems.append(f"main {chapter.main} printed no 'parity:' line")
            elif not row.parity.ok:
                row.problems.append(f"parity with transformers failed: {row.parity}")
        if row.main_ok and check_prints:
            row.problems.extend(stale_prints(book, chapter, main.stdout))
        tests = book.tests_at(number) if run_tests else []
        if tests:
            junit = work / "junit.xml"
            pytest = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 f"--junitxml={junit}", "--rootdir", str(tree), *tests],
                cwd=tree, env=env, capture_output=True, text=True, timeout=chapter.timeout,
            )  # fmt: skip
            row.passed, row.failed = _junit_counts(junit)
            if pytest.returncode != 0:
                notes = explain_import_failure(book, number, pytest.stdout + pytest.stderr)
                tail = "\n".join((pytest.stdout + pytest.stderr).strip().splitlines()[-40:])
                row.problems.append(
                    f"tests failed (pytest exit code {pytest.returncode})"
                    + "".join(f"\n  {n}" for n in notes)
                    + f"\n{tail}"
                )
            elif row.passed == 0:
                row.problems.append("no tests ran")
    except subprocess.TimeoutExpired as e:
        row.problems.append(f"timed out after {e.timeout} s: {e.cmd}")
    finally:
        row.seconds = time.perf_counter() - begin
        if keep is not None:
            shutil.copytree(work, keep / f"ch{chapter.label}", dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return row


def format_table(rows: Iterable[Row]) -> str:
    header = ("chapter", "files", "main", "tests", "HF parity (models x prompts, tokens)",
              "min margin", "seconds", "result")  # fmt: skip
    lines = []
    for r in rows:
        tests = f"{r.passed} passed" + (f", {r.failed} failed" if r.failed else "")
        parity = str(r.parity) if r.parity else ("-" if not r.chapter.parity else "none")
        margin = f"{r.parity.margin:.4f}" if r.parity else "-"
        lines.append((r.chapter.label, str(r.files), "ok" if r.main_ok else "FAIL", tests,
                      parity, margin, f"{r.seconds:.1f}", "ok" if r.ok else "FAIL"))  # fmt: skip
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*l) for l in lines])


def cmd_check(
    book: Book,
    numbers: List[int],
    keep: Optional[Path],
    verbose: bool,
    mains_only: bool = False,
    check_prints: bool = True,
    jobs: int = 1,
) -> int:
    problems = book.verify()
    print(f"manifests: {len(book.chapters)} chapters, "
          f"{len(book.package_files(book.last.number))} package files in the last tree; "
          f"{'consistent' if not problems else f'{len(problems)} problem(s)'}")  # fmt: skip
    for p in problems:
        print(f"  - {p}")
    chosen = numbers or [m.number for m in book.chapters]
    jobs = 1 if verbose else max(1, min(jobs, len(chosen)))  # -v shows the mains' output in order

    def check_one(n: int) -> Row:
        return run_chapter(book, n, keep=keep, verbose=verbose, run_tests=not mains_only,
                           check_prints=check_prints, threads=1 if jobs > 1 else None)  # fmt: skip

    def report(row: Row) -> None:
        state = "ok" if row.ok else "FAILED"
        print(f"chapter {row.chapter.label}: {row.chapter.title}: {state} ({row.seconds:.0f} s)", flush=True)
        for p in row.problems:
            print(f"  - {p}")

    if jobs == 1:
        rows = []
        for n in chosen:
            print(f"chapter {n:02d}: {book.chapter(n).title} ...", flush=True)
            rows.append(check_one(n))
            report(rows[-1])
    else:
        print(f"checking {len(chosen)} chapters, {jobs} at a time, one thread each", flush=True)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            # the longest chapters (the last ones) first, so none is left running alone at the end
            futures = {n: pool.submit(check_one, n) for n in sorted(chosen, reverse=True)}
            for future in as_completed(futures.values()):
                report(future.result())
        rows = [futures[n].result() for n in chosen]
    print()
    print(format_table(rows))
    failed = bool(problems) or any(not r.ok for r in rows)
    print("\nFAILED" if failed else "\nall chapters passed")
    return 1 if failed else 0


def cmd_list(book: Book) -> int:
    for m in book.chapters:
        print(f"{m.label}  {m.title}")
        for kind, paths in (("creates", m.creates), ("modifies", m.modifies), ("early", m.early)):
            for p in paths:
                print(f"      {kind:8s} {p}")
        print(f"      main     {m.main}")
        for t in m.tests:
            print(f"      test     {t}")
        for e in m.exercises:
            print(f"      exercise {e.id}: {e.function} in {e.file}")
    return 0


def cmd_diff(book: Book, a: int, b: int) -> int:
    old, new = book.package_files(a), book.package_files(b)
    for path in sorted(set(old) | set(new)):
        before = old[path].read_text().splitlines() if path in old else []
        after = new[path].read_text().splitlines() if path in new else []
        if before == after:
            continue
        label_a = f"ch{a:02d}/{path}" if path in old else "/dev/null"
        label_b = f"ch{b:02d}/{path}" if path in new else "/dev/null"
        sys.stdout.writelines(
            line + "\n" for line in difflib.unified_diff(before, after, label_a, label_b, lineterm="")
        )
    return 0


def cmd_prints(book: Book, number: int, write: bool) -> int:
    chapter = book.chapter(number)
    if not chapter.page:
        raise BookError(f"chapter {chapter.label} has no page")
    row = run_chapter(book, number)
    if not row.main_ok:
        print("\n".join(row.problems))
        return 1
    page = book.root / chapter.page
    text = page.read_text()
    blocks = prints_blocks(book, chapter)
    if not blocks:
        print(f"{chapter.page} has no '<!-- prints: {chapter.main} -->' block")
        return 1
    stale = stale_prints(book, chapter, row.stdout)
    if not write:
        print("\n".join(stale) if stale else "the block is current")
        return 1 if stale else 0
    fresh = "\n".join(line.rstrip() for line in row.stdout.strip("\n").splitlines()) + "\n"
    for block in reversed(blocks):
        text = text[: block.start("body")] + fresh + text[block.end("body") :]
    page.write_text(text)
    print(f"refreshed {len(blocks)} block(s) in {chapter.page}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Build and check the book's chapters.")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the chapters and the files each one writes")
    p_build = sub.add_parser("build", help="materialise chapter N's tree")
    p_build.add_argument("number", type=int)
    p_build.add_argument("--out", type=Path, required=True)
    p_check = sub.add_parser("check", help="build, run and test chapters in isolation")
    p_check.add_argument("numbers", type=int, nargs="*")
    p_check.add_argument("--keep", type=Path, help="keep each chapter's tree and logs here")
    p_check.add_argument("-v", "--verbose", action="store_true", help="show each main's output")
    p_check.add_argument("--mains-only", action="store_true", help="run the mains, not the tests")
    p_check.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="chapters checked side by side, each with one thread (default: 2, or 1 on one core)",
    )
    p_check.add_argument(
        "--no-prints",
        action="store_true",
        help="do not compare the mains' output with the pages (other devices print other things)",
    )
    p_diff = sub.add_parser("diff", help="how the package changed between two chapters")
    p_diff.add_argument("a", type=int)
    p_diff.add_argument("b", type=int)
    p_prints = sub.add_parser("prints", help="compare or refresh a chapter's 'what it prints'")
    p_prints.add_argument("number", type=int)
    p_prints.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    try:
        book = Book(args.root)
        if args.command == "list":
            return cmd_list(book)
        if args.command == "build":
            out = book.build(args.number, args.out)
            print(f"chapter {args.number:02d}'s tree is in {out}")
            return 0
        if args.command == "check":
            return cmd_check(
                book, args.numbers, args.keep, args.verbose, args.mains_only, not args.no_prints,
                args.jobs,
            )
        if args.command == "diff":
            return cmd_diff(book, args.a, args.b)
        if args.command == "prints":
            return cmd_prints(book, args.number, args.write)
    except BookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
