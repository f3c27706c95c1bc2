"""The staged build: every chapter's tree, built and checked on its own.

N names a chapter (7 or 07) or a project (P1 or p1), everywhere below.

    python tools/steps.py list                 the chapters and what each one writes
    python tools/steps.py build N --out DIR    chapter N's tree (package, mains, tests) in DIR
    python tools/steps.py check [N ...]        build, run and test chapters in isolation
    python tools/steps.py diff N M             how the package changed from chapter N to M
    python tools/steps.py prints N [--write]   compare (or refresh) the "what it prints" block
    python tools/steps.py new N SLUG [--modifies F ...] [--creates F ...]   open chapter N

The book's data (chapters, manifests, trees) lives in tools/book.py; this file runs them.
Each chapter's main and tests run in a fresh temporary copy of its tree, with only that tree
importable (tools/isolation.py), under a time limit, in a process group of their own that is
killed, and reported process by process, if they hang (tools/supervise.py).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple, TypeVar, Union

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: `python tools/steps.py`
    sys.path.insert(0, str(REPO_ROOT))

from tools import supervise  # noqa: E402
from tools.book import Book, BookError, Manifest, chapter_name, folder_of, parse_chapter  # noqa: E402
from tools.isolation import isolated_env  # noqa: E402
from tools.new_chapter import open_chapter  # noqa: E402
from tools.preload import Preloader  # noqa: E402
from tools.prints import PRINTS_RE, compare, normalise  # noqa: E402
from tools.selection import Selector  # noqa: E402

PARITY_RE = re.compile(
    r"^parity: models=(?P<models>\d+) prompts=(?P<prompts>\d+) "
    r"tokens=(?P<matched>\d+)/(?P<total>\d+) min_margin=(?P<margin>[-\d.e+inf]+)",
    re.MULTILINE,
)
T = TypeVar("T")
MISSING_MODULE_RE = re.compile(r"No module named '(?P<module>[\w.]+)'")
MISSING_NAME_RE = re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>[\w.]+)'")


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
    matches = list(PARITY_RE.finditer(stdout))
    if not matches:
        return None
    last = matches[-1]
    return Parity(
        models=int(last["models"]),
        prompts=int(last["prompts"]),
        matched=int(last["matched"]),
        total=int(last["total"]),
        margin=float(last["margin"]),
    )


@dataclass
class TestCounts:
    passed: int = 0
    failed: int = 0
    skipped: List[str] = field(default_factory=list)  # "test id: reason", one per skipped test
    files_run: int = 0  # test files with at least one test run
    not_rerun: Dict[str, int] = field(default_factory=dict)  # test file -> tests not rerun


@dataclass
class Row:
    chapter: Manifest
    files: int = 0
    main_ok: bool = False
    tests: TestCounts = field(default_factory=TestCounts)
    parity: Optional[Parity] = None
    seconds: float = 0.0
    main_seconds: float = 0.0
    tests_seconds: float = 0.0
    problems: List[str] = field(default_factory=list)
    stdout: str = ""
    chapter_tests: List[str] = field(default_factory=list)  # test files at this chapter

    @property
    def ok(self) -> bool:
        return not self.problems


def prints_blocks(book: Book, chapter: Manifest) -> List[re.Match]:
    if not chapter.page or not (book.root / chapter.page).exists():
        return []
    text = (book.root / chapter.page).read_text()
    return [b for b in PRINTS_RE.finditer(text) if b["main"] == chapter.main]


def stale_prints(book: Book, chapter: Manifest, stdout: str) -> List[str]:
    """Why the page's "what it prints" blocks do not show `stdout` (empty: they do)."""
    problems = []
    blocks = prints_blocks(book, chapter)
    if chapter.page and (book.root / chapter.page).exists() and not blocks:
        problems.append(f"{chapter.page} shows no '<!-- prints: {chapter.main} -->' block")
    for block in blocks:
        differences = compare(block["body"], stdout, book.print_rules(chapter))
        if differences:
            problems.append(
                f"the 'what it prints' block in {chapter.page} is stale "
                f"(refresh it with: python tools/steps.py prints {chapter.arg} --write):\n"
                + "\n".join(differences)
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
                    f"{chapter_name(number)} imports {module}, which only {owner.name} "
                    "creates: "
                    f"a chapter may use only the files of its own tree (bring the file in early, "
                    f"or move the code to {owner.name})"
                )
                break
        else:
            notes.append(f"{chapter_name(number)} imports {module}, which no chapter up to it has")
    for m in MISSING_NAME_RE.finditer(stderr):
        if m["module"].split(".")[0] == book.package:
            notes.append(
                f"{chapter_name(number)} imports {m['name']} from {m['module']}, which that "
                f"module's version at {chapter_name(number)} does not define"
            )
    return notes


def junit_counts(path: Path) -> TestCounts:
    counts = TestCounts()
    if not path.exists():
        return counts
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}"
        if case.find("skipped") is not None:
            counts.skipped.append(f"{name}: {case.find('skipped').get('message', '')}")
        elif case.find("failure") is not None or case.find("error") is not None:
            counts.failed += 1
        else:
            counts.passed += 1
    return counts


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# The work folders of the runs in progress: an interrupted check removes them itself, since
# the threads that would have are stopped with the process.
_WORK: Set[Path] = set()
_WORK_LOCK = threading.Lock()


def _start_tree(book: Book, chapter: Manifest, what: str) -> Tuple[Path, Path]:
    work = Path(tempfile.mkdtemp(prefix=f"minisgl-{chapter.slug}-{what}-"))
    with _WORK_LOCK:
        _WORK.add(work)
    try:
        return work, book.build(chapter.number, work / "tree")
    except BaseException:  # a manifest that names a missing file, say: nothing stays behind
        _finish_tree(work, None, chapter)
        raise


def _finish_tree(work: Path, keep: Optional[Path], chapter: Manifest) -> None:
    if keep is not None:
        shutil.copytree(work, keep / chapter.slug, dirs_exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    with _WORK_LOCK:
        _WORK.discard(work)


def _remove_work() -> None:
    with _WORK_LOCK:
        for work in _WORK:
            shutil.rmtree(work, ignore_errors=True)
        _WORK.clear()


def run_main(
    book: Book,
    row: Row,
    keep: Optional[Path] = None,
    verbose: bool = False,
    check_prints: bool = True,
    threads: Optional[int] = None,
    nice: int = 0,
) -> None:
    """Build the chapter's tree and run its main there (at priority `nice`); fill in `row`."""
    chapter, number = row.chapter, row.chapter.number
    work, tree = _start_tree(book, chapter, "main")
    try:
        row.files = len(book.package_files(number))
        env = isolated_env(book.package, number, tree, threads)
        main = supervise.run([sys.executable, chapter.main], tree, env, chapter.timeout, nice)
        row.stdout, row.main_seconds = main.stdout, main.seconds
        row.main_ok = main.returncode == 0 and not main.left_behind
        if verbose:
            sys.stdout.write(main.stdout)
        row.problems.extend(main.report(f"main {chapter.main}", chapter.timeout))
        if main.returncode not in (0, None):
            notes = explain_import_failure(book, number, main.stderr)
            tail = _tail(main.stderr, 15)
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
    finally:
        _finish_tree(work, keep, chapter)


# A chapter's tests expected to take longer than this (from their last run) are shared between
# two pytest processes, test file by test file: the tests run chapter after chapter, so their
# chain sets the check's time, and the mains beside them yield their cores (MAIN_NICE).
SPLIT_S = 10.0
MAIN_NICE = 10  # a main's priority beside the tests (see _check)


def run_chapter_tests(
    book: Book,
    row: Row,
    selector: Selector,
    everything: bool,
    keep: Optional[Path] = None,
    threads: Optional[int] = None,
    files: Optional[List[str]] = None,
) -> None:
    """Build the chapter's tree and run the tests `selector` chooses there among `files` (the
    chapter's test files when None; all their tests when `everything`), recording what each
    one runs for the chapters after it; add the results to `row`. Several calls for one chapter,
    on disjoint `files`, may run at the same time."""
    chapter, number = row.chapter, row.chapter.number
    work, tree = _start_tree(book, chapter, "tests")
    try:
        with selector.lock:
            row.chapter_tests = book.tests_at(number)
            selection = selector.select(
                chapter, tree, row.chapter_tests if files is None else files, everything
            )
            row.tests.files_run += selection.files_run
            row.tests.not_rerun.update(selection.not_rerun)
        if keep is not None:
            with (work / "selection.txt").open("a") as out:
                out.writelines(
                    f"{n}: {'; '.join(why)}\n" for n, why in sorted(selection.reasons.items())
                )
        if not selection.arguments:
            return
        expected = sum(selector.seconds(a) for a in selection.arguments)
        groups = selection.groups(selector.seconds, 2 if expected > SPLIT_S else 1)
        runs = _in_parallel(
            [lambda g=g, i=i: _pytest(book, chapter, tree, work / f"run{i}", g, threads)
             for i, g in enumerate(groups)]
        )  # fmt: skip
        with selector.lock:
            row.tests_seconds += max(run.seconds for run, _ in runs)
            for run, folder in runs:
                selector.remember(folder / "record", number)
                passed, failed, skipped = _counts(folder / "junit.xml")
                row.tests.passed += passed
                row.tests.failed += failed
                row.tests.skipped += skipped
                row.problems.extend(run.report("the tests", chapter.timeout))
                if run.returncode not in (0, None):
                    output = run.stdout + run.stderr
                    notes = explain_import_failure(book, number, output)
                    row.problems.append(
                        f"tests failed (pytest exit code {run.returncode})"
                        + "".join(f"\n  {n}" for n in notes)
                        + f"\n{_tail(output, 40)}"
                    )
            row.problems.extend(selection.unpredicted(folder / "loaded" for _, folder in runs))
    finally:
        _finish_tree(work, keep, chapter)


def _no_tests_ran(row: Row) -> None:
    if not row.problems and row.tests.passed == 0:
        row.problems.append("no tests ran")


def _pytest(
    book: Book, chapter: Manifest, tree: Path, folder: Path, args: List[str], threads: Optional[int]
) -> Tuple[supervise.Outcome, Path]:
    """One pytest process in `tree` on `args`, in one process; its junit report, its record of
    what each test ran and its list of loaded modules go to `folder`."""
    for sub in ("loaded", "record"):
        (folder / sub).mkdir(parents=True)
    env = {
        **isolated_env(book.package, chapter.number, tree, threads),
        "MINISGL_BOOK_LOADED": str(folder / "loaded"),
        "MINISGL_BOOK_RECORD": str(folder / "record"),
    }
    command = [sys.executable, "-m", "pytest", *supervise.PYTEST_ONE_PROCESS, "-q",
               "-p", "no:cacheprovider", "-p", "book_record_plugin", "-rfEs",
               f"--junitxml={folder / 'junit.xml'}", "--rootdir", str(tree), *args]  # fmt: skip
    return supervise.run(command, tree, env, chapter.timeout), folder


def _in_parallel(calls: List[Callable[[], T]]) -> List[T]:
    """Run the calls at the same time, each in a thread; their results in order."""
    if len(calls) == 1:
        return [calls[0]()]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def _counts(junit: Path) -> Tuple[int, int, List[str]]:
    counts = junit_counts(junit)
    return counts.passed, counts.failed, counts.skipped


def run_chapter(
    book: Book,
    number: int,
    keep: Optional[Path] = None,
    verbose: bool = False,
    run_tests: bool = True,
    check_prints: bool = True,
    threads: Optional[int] = None,
    selector: Optional[Selector] = None,
) -> Row:
    """Check one chapter: its main, then its tests. With a `selector` that holds the records
    of earlier chapters of the same check, carried-forward tests that ran nothing the chapter
    changed are not rerun; without one, every test runs."""
    row = Row(book.chapter(number))
    begin = time.perf_counter()
    try:
        run_main(book, row, keep, verbose, check_prints, threads)
        if run_tests:
            everything = selector is None
            run_chapter_tests(book, row, selector or Selector(book), everything, keep, threads)
            _no_tests_ran(row)
    finally:
        row.seconds = time.perf_counter() - begin
    return row


def format_table(rows: Iterable[Row]) -> str:
    header = (
        "chapter",
        "files",
        "main",
        "tests",
        "test files run",
        "HF parity (models x prompts, tokens)",
        "min margin",
        "main s",
        "tests s",
        "result",
    )
    lines = []
    for r in rows:
        tests = f"{r.tests.passed} passed" + (
            f", {r.tests.failed} failed" if r.tests.failed else ""
        )
        tests += f", {len(r.tests.skipped)} skipped" if r.tests.skipped else ""
        files_run = f"{r.tests.files_run} of {len(r.chapter_tests)}"
        parity = str(r.parity) if r.parity else ("-" if not r.chapter.parity else "none")
        margin = f"{r.parity.margin:.4f}" if r.parity else "-"
        lines.append(
            (
                r.chapter.label,
                str(r.files),
                "ok" if r.main_ok else "FAIL",
                tests,
                files_run,
                parity,
                margin,
                f"{r.main_seconds:.0f}",
                f"{r.tests_seconds:.0f}",
                "ok" if r.ok else "FAIL",
            )
        )
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    rule = fmt.format(*("-" * w for w in widths))
    return "\n".join([fmt.format(*header), rule] + [fmt.format(*line) for line in lines])


class _Plan:
    """The order of a check's work on its workers. The mains are independent. A carried-forward
    test file is chosen, in each chapter, from what it ran where it last ran (tools/selection.py),
    so a test file goes through the chapters in order; different test files do not wait for each
    other. A chapter's tests therefore go in batches: test files whose earlier chapters are done.

    A free worker takes, in this order: the tests of the earliest chapter whose test files are
    all ready (one batch, one tree); else a main (the later chapters' first: they take longest);
    else a chapter's own test files, which wait for nothing (the later chapters' first); else the
    ready part of the earliest chapter's tests; else it waits for a batch to finish."""

    def __init__(self, book: Book, chosen: List[int], mains: bool, tests: bool) -> None:
        self.mains = sorted(chosen, reverse=True) if mains else []
        self.waiting: Dict[int, List[str]] = (
            {n: list(book.tests_at(n)) for n in sorted(chosen)} if tests else {}
        )
        self.own = {n: set(book.chapter(n).tests) for n in chosen}
        self.running: Dict[int, Set[str]] = {n: set() for n in chosen}
        self.cond = threading.Condition()

    def _ready(self, n: int) -> List[str]:
        """Chapter n's waiting test files that no earlier chapter still has to run."""
        busy = {f for m, files in self.waiting.items() if m < n for f in files}
        busy |= {f for m, files in self.running.items() if m < n for f in files}
        return [f for f in self.waiting[n] if f not in busy]

    def _start(self, n: int, files: List[str]) -> Tuple[str, int, List[str]]:
        self.waiting[n] = [f for f in self.waiting[n] if f not in files]
        if not self.waiting[n]:
            del self.waiting[n]
        self.running[n] |= set(files)
        return "tests", n, files

    def take(self) -> Optional[Tuple[str, int, List[str]]]:
        """The next task, waiting for one if need be; None when all is done."""
        with self.cond:
            while (task := self.next()) == "wait":
                self.cond.wait()
            return task  # type: ignore[return-value]

    def next(self) -> Union[Tuple[str, int, List[str]], None, str]:
        """The next task; "wait" if there is none until a running one finishes; None when all
        is done."""
        ready = {n: self._ready(n) for n in sorted(self.waiting)}
        for n, files in ready.items():
            if len(files) == len(self.waiting[n]):
                return self._start(n, files)
        if self.mains:
            return "main", self.mains.pop(0), []
        for n in sorted(ready, reverse=True):
            own = [f for f in ready[n] if f in self.own[n]]
            if own:
                return self._start(n, own)
        for n, files in ready.items():
            if files:
                return self._start(n, files)
        return None if not self.waiting and not any(self.running.values()) else "wait"

    def done(self, kind: str, n: int, files: List[str]) -> bool:
        """Mark a task finished; True when it was the last test batch of chapter n."""
        with self.cond:
            self.running[n] -= set(files)
            self.cond.notify_all()
            return kind == "tests" and n not in self.waiting and not self.running[n]


def cmd_check(
    book: Book,
    numbers: List[int],
    keep: Optional[Path],
    verbose: bool,
    mains_only: bool = False,
    check_prints: bool = True,
    jobs: int = 1,
    all_tests: bool = False,
    preload: bool = True,
) -> int:
    preloader = Preloader.start() if preload else None
    supervise.use_preloader(preloader)
    try:
        return _check(book, numbers, keep, verbose, mains_only, check_prints, jobs, all_tests)
    finally:
        supervise.use_preloader(None)
        if preloader is not None:
            preloader.stop()


def _check(
    book: Book,
    numbers: List[int],
    keep: Optional[Path],
    verbose: bool,
    mains_only: bool,
    check_prints: bool,
    jobs: int,
    all_tests: bool,
) -> int:
    problems = book.verify()
    print(
        f"manifests: {len(book.chapters)} chapters, "
        f"{len(book.package_files(book.last.number))} package files in the last tree; "
        f"{'consistent' if not problems else f'{len(problems)} problem(s)'}"
    )
    for p in problems:
        print(f"  - {p}")
    chosen = numbers or [m.number for m in book.chapters]
    jobs = 1 if verbose else max(1, min(jobs, 2 * len(chosen)))  # -v shows mains in order
    threads = 1 if jobs > 1 else None  # a main alone may use every core
    # The tests get one thread per process even then: many start servers, ranks and workers,
    # several processes at once, whose thread pools would spin against each other on the
    # same cores (a full `--jobs 1` check with a thread per core: 3,416 busy core-s, 31 min).
    test_threads = 1
    # The tests go chapter after chapter (each test file's selection needs its last run), so
    # their chain sets the check's time; the mains only fill the cores around it. Beside the
    # tests a main runs at a lower priority: it takes what the tests leave (a chapter with
    # one batch, the waits of the servers' tests) instead of a third of the tests' cores.
    main_nice = MAIN_NICE if jobs > 1 and not mains_only else 0
    rows = {n: Row(book.chapter(n)) for n in chosen}
    selector = Selector(book)
    pending = {n: (0 if mains_only else 1) + 1 for n in chosen}  # parts left per chapter
    lock = threading.Lock()

    def report(row: Row) -> None:
        state = "ok" if row.ok else "FAILED"
        print(
            f"{row.chapter.name}: {row.chapter.title}: {state} ({row.seconds:.0f} s)",
            flush=True,
        )
        for p in row.problems:
            print(f"  - {p}")
        for skipped in row.tests.skipped:
            print(f"  skipped {skipped}")
        if row.tests.not_rerun:
            listed = ", ".join(f"{Path(t).name} ({k})" for t, k in row.tests.not_rerun.items())
            print(f"  not rerun (they ran nothing that changed since they last ran): {listed}")

    def work(kind: str, n: int, files: List[str]) -> None:
        row = rows[n]
        if kind == "main":
            run_main(book, row, keep, verbose, check_prints, threads, main_nice)
        else:
            run_chapter_tests(book, row, selector, all_tests, keep, test_threads, files or None)

    def finished(kind: str, n: int, last_batch: bool) -> None:
        with lock:
            if kind == "main" or last_batch:
                pending[n] -= 1
            if kind == "tests" and last_batch:
                _no_tests_ran(rows[n])
            if pending[n] == 0:
                row = rows[n]
                row.seconds = row.main_seconds + row.tests_seconds
                report(row)

    plan = _Plan(book, chosen, mains=True, tests=not mains_only)
    if jobs == 1:
        for n in chosen:
            print(f"{chapter_name(n)}: {book.chapter(n).title} ...", flush=True)
            work("main", n, [])
            finished("main", n, False)
            if not mains_only:
                work("tests", n, [])
                finished("tests", n, True)
    else:
        if len(chosen) == 1:
            print(
                f"{chapter_name(chosen[0])}: {book.chapter(chosen[0]).title}: its main and its "
                "tests side by side, one thread each ...",
                flush=True,
            )
        else:
            print(
                f"checking {len(chosen)} chapters with {jobs} workers, one thread each: the "
                "mains side by side, each test file through the chapters in order",
                flush=True,
            )
        errors: List[BaseException] = []

        def worker() -> None:
            while not errors:
                task = plan.take()
                if task is None:
                    return
                try:
                    work(*task)
                    finished(task[0], task[1], plan.done(*task))
                except BaseException as e:  # noqa: BLE001 - reported below, after the others stop
                    errors.append(e)
                    plan.done(*task)
                    supervise.stop_everything()

        workers = [threading.Thread(target=worker, daemon=True) for _ in range(jobs)]
        for t in workers:
            t.start()
        try:
            for t in workers:
                while t.is_alive():
                    t.join(0.5)
        except KeyboardInterrupt:  # before the workers wait for their commands
            errors.append(KeyboardInterrupt())
            supervise.stop_everything()
            raise
        if errors:
            raise errors[0]
    ordered = [rows[n] for n in chosen]
    print()
    print(format_table(ordered))
    failed = bool(problems) or any(not r.ok for r in ordered)
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
    book.chapter(a), book.chapter(b)  # an unknown chapter fails here, not as an empty diff
    old, new = book.package_files(a), book.package_files(b)
    for path in sorted(set(old) | set(new)):
        before = old[path].read_text().splitlines() if path in old else []
        after = new[path].read_text().splitlines() if path in new else []
        if before == after:
            continue
        label_a = f"{folder_of(a)}/{path}" if path in old else "/dev/null"
        label_b = f"{folder_of(b)}/{path}" if path in new else "/dev/null"
        sys.stdout.writelines(
            line + "\n"
            for line in difflib.unified_diff(before, after, label_a, label_b, lineterm="")
        )
    return 0


def cmd_prints(book: Book, number: int, write: bool) -> int:
    chapter = book.chapter(number)
    if not chapter.page:
        raise BookError(f"{chapter.name} has no page")
    row = run_chapter(book, number, run_tests=False, check_prints=False)
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
    fresh = normalise(row.stdout) + "\n"
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
    p_build.add_argument("number", type=parse_chapter)
    p_build.add_argument("--out", type=Path, required=True)
    p_check = sub.add_parser("check", help="build, run and test chapters in isolation")
    p_check.add_argument("numbers", type=parse_chapter, nargs="*")
    p_check.add_argument("--keep", type=Path, help="keep each chapter's tree and logs here")
    p_check.add_argument("-v", "--verbose", action="store_true", help="show each main's output")
    p_check.add_argument("--mains-only", action="store_true", help="run the mains, not the tests")
    p_check.add_argument(
        "--all-tests",
        action="store_true",
        help="rerun every carried-forward test file in every chapter, changed or not",
    )
    p_check.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="workers, each running one main or one batch of tests with one thread (default: 2, "
        "or 1 on one core; 3 was no faster on 2 cores and made timing-bound tests flakier)",
    )
    p_check.add_argument(
        "--no-preload",
        action="store_true",
        help="start every main and test run as a fresh interpreter (tools/preload.py forks "
        "them from one that imported torch, transformers and pytest once)",
    )
    p_check.add_argument(
        "--no-prints",
        action="store_true",
        help="do not compare the mains' output with the pages (other devices print other things)",
    )
    p_diff = sub.add_parser("diff", help="how the package changed between two chapters")
    p_diff.add_argument("a", type=parse_chapter)
    p_diff.add_argument("b", type=parse_chapter)
    p_new = sub.add_parser("new", help="open chapter N: manifest, skeletons, kept versions")
    p_new.add_argument("number", type=parse_chapter)
    p_new.add_argument(
        "slug", help="a word for the file names: examples/chNN_SLUG.py (pK_SLUG.py), ..."
    )
    p_new.add_argument("--modifies", nargs="*", default=[], help="package files it will change")
    p_new.add_argument("--creates", nargs="*", default=[], help="package files it will add")
    p_prints = sub.add_parser("prints", help="compare or refresh a chapter's 'what it prints'")
    p_prints.add_argument("number", type=parse_chapter)
    p_prints.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        book = Book(args.root)
        if args.command == "list":
            return cmd_list(book)
        if args.command == "build":
            out = book.build(args.number, args.out)
            print(f"{chapter_name(args.number)}'s tree is in {out}")
            return 0
        if args.command == "check":
            return cmd_check(
                book,
                args.numbers,
                args.keep,
                args.verbose,
                args.mains_only,
                not args.no_prints,
                args.jobs,
                args.all_tests,
                not args.no_preload,
            )
        if args.command == "diff":
            return cmd_diff(book, args.a, args.b)
        if args.command == "prints":
            return cmd_prints(book, args.number, args.write)
        if args.command == "new":
            for line in open_chapter(book, args.number, args.slug, args.modifies, args.creates):
                print(line)
            return 0
    except BookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        supervise.stop_everything()
        _remove_work()
        print("\ninterrupted: every process the check started is stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `steps.py list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
