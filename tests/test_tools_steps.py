"""tools/steps.py on small fixture books: every rule of the staged build, and every way to
break one, gives the verdict and the message a reader needs."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import pytest

from tools import supervise
from tools.book import Book
from tools.preload import Preloader
from tools.prints import mask_output
from tools.steps import _Plan, main, parse_parity, run_chapter

PARITY_OK = "parity: models=1 prompts=2 tokens=10/10 min_margin=0.5000"


def _write(root: Path, files: Dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))


def make_book(root: Path, overrides: Dict[str, Optional[str]] | None = None) -> Path:
    """Three chapters: 0 creates minisgl/core.py, 1 creates util.py and modifies core.py,
    2 modifies util.py. `overrides` replaces files (None deletes one)."""
    files = {
        "chapters/book.toml": 'package = "minisgl"\nsupport = ["tests/support.py"]\n',
        "tests/support.py": "HELPER = 1\n",
        "chapters/ch00/manifest.toml": """
            chapter = 0
            title = "zero"
            main = "examples/ch00_main.py"
            tests = ["tests/test_ch00_core.py"]
            creates = ["minisgl/__init__.py", "minisgl/core.py"]
            """,
        "chapters/ch00/minisgl/core.py": "VALUE = 0\n",
        "chapters/ch01/manifest.toml": """
            chapter = 1
            title = "one"
            page = "docs/ch01.md"
            main = "examples/ch01_main.py"
            tests = ["tests/test_ch01_util.py"]
            creates = ["minisgl/util.py"]
            modifies = ["minisgl/core.py"]
            [prints]
            mask = ['took [\\d.]+ s']
            """,
        "chapters/ch01/minisgl/util.py": "def double(x):\n    return 2 * x\n",
        "chapters/ch02/manifest.toml": """
            chapter = 2
            title = "two"
            main = "examples/ch02_main.py"
            tests = ["tests/test_ch02_util.py"]
            modifies = ["minisgl/util.py"]
            [retire]
            "tests/test_ch01_util.py" = "chapter 2 changes double() into triple()"
            """,
        "minisgl/__init__.py": "",
        "minisgl/core.py": "VALUE = 1\n",
        "minisgl/util.py": "def triple(x):\n    return 3 * x\n",
        "examples/ch00_main.py": f"""
            import minisgl.core
            print("core", minisgl.core.VALUE)
            print("{PARITY_OK}")
            """,
        "examples/ch01_main.py": f"""
            from minisgl.util import double
            print("double", double(2), "took 1.5 s")
            print("{PARITY_OK}")
            """,
        "examples/ch02_main.py": f"""
            from minisgl.util import triple
            print("triple", triple(2))
            print("{PARITY_OK}")
            """,
        "tests/test_ch00_core.py": """
            import minisgl.core
            def test_value():
                assert minisgl.core.VALUE in (0, 1)
            """,
        "tests/test_ch01_util.py": """
            from minisgl.util import double
            def test_double():
                assert double(3) == 6
            """,
        "tests/test_ch02_util.py": """
            from minisgl.util import triple
            def test_triple():
                assert triple(3) == 9
            """,
        "docs/ch01.md": """
            # One
            <!-- prints: examples/ch01_main.py -->
            ```text
            double 4 took 0.9 s
            parity: models=1 prompts=2 tokens=10/10 min_margin=0.5000
            ```
            """,
    }
    files.update(overrides or {})
    _write(root, {k: v for k, v in files.items() if v is not None})
    return root


NOT_RERUN = "not rerun (they ran nothing that changed since they last ran)"


def check(root: Path, *numbers: int | str, preload: bool = False) -> tuple[int, str]:
    """`steps.py check` on a fixture book; its mains and tests start as fresh interpreters
    unless `preload` (tools/preload.py pays 4 s of imports once, a loss on these tiny books)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[1] / "tools" / "steps.py"),
            "--root",
            str(root),
            "check",
            *map(str, numbers),
            *([] if preload else ["--no-preload"]),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_a_good_book_passes_and_reports_each_chapter(tmp_path: Path) -> None:
    code, out = check(make_book(tmp_path))
    assert code == 0, out
    assert "manifests: 3 chapters, 3 package files in the last tree; consistent" in out
    rows = [line.split() for line in out.splitlines() if line[:3] in ("00 ", "01 ", "02 ")]
    assert [r[0] for r in rows] == ["00", "01", "02"]
    # chapter, files, main, tests passed, parity, min margin ... result
    assert rows[0][1:4] == ["2", "ok", "1"] and rows[2][-1] == "ok"
    assert "1 x 2, 10/10" in out and "0.5000" in out


def test_versions_resolve_to_the_latest_writer(tmp_path: Path) -> None:
    book = Book(make_book(tmp_path))
    assert book.package_files(0)["minisgl/core.py"].read_text() == "VALUE = 0\n"
    assert book.package_files(1)["minisgl/core.py"].read_text() == "VALUE = 1\n"
    assert "double" in book.package_files(1)["minisgl/util.py"].read_text()
    assert "triple" in book.package_files(2)["minisgl/util.py"].read_text()
    assert book.tests_at(2) == ["tests/test_ch00_core.py", "tests/test_ch02_util.py"]


def test_build_materialises_only_that_chapters_files(tmp_path: Path) -> None:
    root = make_book(tmp_path / "book")
    assert main(["--root", str(root), "build", "0", "--out", str(tmp_path / "t0")]) == 0
    files = sorted(
        p.relative_to(tmp_path / "t0").as_posix()
        for p in (tmp_path / "t0").rglob("*")
        if p.is_file()
    )
    assert files == [
        "examples/ch00_main.py",
        "minisgl/__init__.py",
        "minisgl/core.py",
        "tests/support.py",
        "tests/test_ch00_core.py",
    ]
    assert (tmp_path / "t0" / "minisgl" / "core.py").read_text() == "VALUE = 0\n"


def test_diff_shows_the_change_between_chapters(tmp_path: Path, capsys) -> None:
    root = make_book(tmp_path)
    assert main(["--root", str(root), "diff", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert (
        "--- ch01/minisgl/util.py" in out and "+def triple(x):" in out and "-def double(x):" in out
    )
    assert "core.py" not in out


def test_a_main_that_imports_a_later_chapters_module_fails_clearly(tmp_path: Path) -> None:
    root = make_book(
        tmp_path, {"examples/ch00_main.py": f"import minisgl.util\nprint('{PARITY_OK}')\n"}
    )
    code, out = check(root, 0)
    assert code != 0
    assert "chapter 00 imports minisgl.util, which only chapter 01 creates" in out


def test_a_chapter_without_the_package_cannot_import_an_installed_one(tmp_path: Path) -> None:
    """An installed or repository copy of the package must not leak into a chapter's run."""
    decoy = tmp_path / "decoy"
    _write(decoy, {"minisgl/__init__.py": "", "minisgl/later.py": "X = 1\n"})
    root = make_book(
        tmp_path / "book",
        {"examples/ch00_main.py": f"import minisgl.later\nprint('{PARITY_OK}')\n"},
    )
    env = {**os.environ, "PYTHONPATH": str(decoy)}
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[1] / "tools" / "steps.py"),
            "--root",
            str(root),
            "check",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode != 0
    assert "No module named 'minisgl.later'" in proc.stdout


@pytest.mark.parametrize(
    "overrides, message",
    [
        (  # creates a file that exists already
            {
                "chapters/ch01/manifest.toml": 'chapter = 1\ntitle = "one"\n'
                'main = "examples/ch01_main.py"\n'
                'tests = ["tests/test_ch01_util.py"]\ncreates = ["minisgl/util.py", '
                '"minisgl/core.py"]\n'
            },
            "chapter 01 says it creates minisgl/core.py, but chapter 00 already wrote it",
        ),
        (  # modifies a file nobody wrote
            {
                "chapters/ch00/manifest.toml": 'chapter = 0\ntitle = "zero"\n'
                'main = "examples/ch00_main.py"\n'
                'tests = ["tests/test_ch00_core.py"]\ncreates = ["minisgl/__init__.py"]\nmodifies '
                '= ["minisgl/core.py"]\n'
            },
            "chapter 00 says it modifies minisgl/core.py, which no earlier chapter wrote",
        ),
        (  # "modifies" with no change
            {"chapters/ch00/minisgl/core.py": "VALUE = 1\n"},
            "chapter 01 says it modifies minisgl/core.py, but its version is identical to chapter "
            "00's",
        ),
        (  # a stray file in a chapter folder
            {"chapters/ch01/minisgl/stray.py": "X = 1\n"},
            "chapters/ch01/minisgl/stray.py should not be there: the manifest does not name it",
        ),
        (  # the last version kept in the chapter folder instead of the package
            {"chapters/ch02/minisgl/util.py": "def triple(x):\n    return 3 * x\n"},
            "chapters/ch02/minisgl/util.py should not be there: its last version belongs in the "
            "package folder",
        ),
        (  # the package holds a file no manifest writes
            {"minisgl/extra.py": "X = 1\n"},
            "minisgl/extra.py is in minisgl/, but no chapter's manifest writes it",
        ),
        (  # an earlier version is missing
            {"chapters/ch00/minisgl/core.py": None},
            "chapter 00 writes minisgl/core.py, but chapters/ch00/minisgl/core.py is missing",
        ),
        (  # retiring a test without saying why
            {
                "chapters/ch02/manifest.toml": 'chapter = 2\ntitle = "two"\n'
                'main = "examples/ch02_main.py"\n'
                'tests = ["tests/test_ch02_util.py"]\nmodifies = '
                '["minisgl/util.py"]\n[retire]\n"tests/test_ch01_util.py" = ""\n'
            },
            "chapter 02 retires tests/test_ch01_util.py without a reason",
        ),
        (  # a chapter test file no manifest names
            {"tests/test_ch01_orphan.py": "def test_x():\n    pass\n"},
            "tests/test_ch01_orphan.py is not named by any chapter's manifest",
        ),
    ],
    ids=[
        "creates-existing",
        "modifies-missing",
        "modifies-unchanged",
        "stray-file",
        "final-in-chapter-folder",
        "package-extra",
        "version-missing",
        "retire-no-reason",
        "orphan-test",
    ],
)
def test_manifests_that_lie_are_caught(
    tmp_path: Path, overrides: Dict[str, str], message: str
) -> None:
    root = make_book(tmp_path, overrides)
    assert message in "\n".join(Book(root).verify())
    temp = tmp_path / "temp"  # where the check makes its work folders
    temp.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(temp))
        code, out = check(root, 0)
    assert code != 0 and message in out
    assert not list(temp.iterdir())  # a tree that could not be built leaves nothing behind


def test_a_failing_test_fails_the_chapter(tmp_path: Path) -> None:
    root = make_book(
        tmp_path, {"tests/test_ch00_core.py": "def test_broken():\n    assert 1 == 2\n"}
    )
    code, out = check(root, 0)
    assert code != 0 and "tests failed" in out and "0 passed, 1 failed" in out


def test_chapters_side_by_side_report_what_one_at_a_time_reports(tmp_path: Path) -> None:
    root = make_book(
        tmp_path, {"tests/test_ch00_core.py": "def test_broken():\n    assert 1 == 2\n"}
    )
    tables = []
    for jobs, preload in (("1", False), ("3", True)):  # and forked from the preloader
        code, out = check(root, "--jobs", jobs, preload=preload)
        assert code != 0 and "tests failed" in out, out  # chapter 00's failure is not lost
        rows = [line.split() for line in out.splitlines() if line[:3] in ("00 ", "01 ", "02 ")]
        tables.append([r[:-3] + r[-1:] for r in rows])  # all but the seconds
    assert tables[0] == tables[1] and [r[0] for r in tables[1]] == ["00", "01", "02"]
    assert tables[1][0][-1] == "FAIL"


class _PlanBook:
    """What _Plan reads of a book: chapter n has its own test file t{n} and carries the others."""

    def __init__(self, chapters: int) -> None:
        self.chapters = chapters

    def tests_at(self, n: int) -> List[str]:
        return [f"t{m}" for m in range(n + 1)]

    def chapter(self, n: int) -> SimpleNamespace:
        return SimpleNamespace(tests=[f"t{n}"])


def _run_plan(seed: int) -> bool:
    """Three workers that finish in a random order; True if two test batches ran at once."""
    rng = random.Random(seed)
    plan = _Plan(_PlanBook(8), list(range(8)), mains=True, tests=True)  # type: ignore[arg-type]
    running: List[Tuple[str, int, List[str]]] = []
    done: Dict[str, List[int]] = {}
    mains: List[int] = []
    overlapped = False
    while True:
        while len(running) < 3 and isinstance(task := plan.next(), tuple):
            kind, n, files = task
            for f in files:
                assert all(m < n for m in done.get(f, [])), (f, n, done)
                assert not any(f in r[2] and r[1] < n for r in running), (f, n, running)
            overlapped |= kind == "tests" and any(r[0] == "tests" for r in running)
            running.append(task)
        if not running:
            assert plan.next() is None
            break
        kind, n, files = running.pop(rng.randrange(len(running)))
        plan.done(kind, n, files)
        if kind == "main":
            mains.append(n)
        for f in files:
            done.setdefault(f, []).append(n)
    assert sorted(mains) == list(range(8))
    assert done == {f"t{m}": list(range(m, 8)) for m in range(8)}
    return overlapped


def test_the_plan_runs_each_test_file_through_the_chapters_in_order() -> None:
    """Every test file runs once in every chapter, and never in a chapter while an earlier
    chapter still has it to run or is running it (its selection there reads the record of the
    chapter before); different test files do run at the same time."""
    assert sum(_run_plan(seed) for seed in range(30)) >= 10


def test_a_parity_mismatch_fails_the_chapter(tmp_path: Path) -> None:
    root = make_book(
        tmp_path,
        {
            "examples/ch00_main.py": "print('parity: models=1 prompts=2 tokens=9/10 "
            "min_margin=0.5000')\n"
        },
    )
    code, out = check(root, 0)
    assert code != 0 and "parity with transformers failed: 1 x 2, 9/10" in out


def test_a_main_without_a_parity_line_fails(tmp_path: Path) -> None:
    root = make_book(tmp_path, {"examples/ch00_main.py": "print('hello')\n"})
    code, out = check(root, 0)
    assert code != 0 and "printed no 'parity:' line" in out


def test_a_stale_prints_block_fails_and_masks_only_what_varies(tmp_path: Path) -> None:
    root = make_book(tmp_path)
    assert check(root, 1)[0] == 0  # "took 0.9 s" in the page vs "took 1.5 s": masked
    (root / "docs" / "ch01.md").write_text(
        (root / "docs" / "ch01.md").read_text().replace("double 4", "double 5")
    )
    code, out = check(root, 1)
    assert code != 0 and "block in docs/ch01.md is stale" in out and "+double 4" in out
    assert main(["--root", str(root), "prints", "1", "--write"]) == 0
    assert "double 4 took 1.5 s" in (root / "docs" / "ch01.md").read_text()
    assert check(root, 1)[0] == 0


def test_retired_tests_stop_running_from_their_chapter(tmp_path: Path) -> None:
    root = make_book(tmp_path)
    row = run_chapter(Book(root), 2)
    assert row.ok, row.problems
    assert row.tests.passed == 2  # ch00's and ch02's, not ch01's (which would fail on triple())


def test_parse_and_mask_helpers() -> None:
    p = parse_parity("x\nparity: models=5 prompts=3 tokens=478/478 min_margin=0.0107\n")
    assert (
        p is not None and p.ok and str(p) == "5 x 3, 478/478" and p.margin == pytest.approx(0.0107)
    )
    assert parse_parity("no line") is None
    assert mask_output("a 12.5\nb\n", [r"\s+[\d.]+$"]) == "a#\nb"
    # a group named v masks only itself
    row = "tiny  'x'  32   yes  0.0158   209.6\nop  0.00123"
    assert (
        mask_output(row, [r"^.* (?:yes|NO) +[\d.]+(?P<v> +[\d.]+)$"])
        == "tiny  'x'  32   yes  0.0158#\nop  0.00123"
    )


# ------------------------------------------------------------------ nothing hangs, nothing stays
HANGING_MAIN = """
import multiprocessing as mp
import sys
import time


def wait_for_ever():
    time.sleep(3600)


if __name__ == "__main__":
    child = mp.get_context("spawn").Process(target=wait_for_ever)
    child.start()
    with open(sys.argv[0] + ".pid", "w") as f:
        f.write(str(child.pid))
    child.join()
"""


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie has exited too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("preload", [False, True], ids=["fresh", "preloaded"])
def test_a_hung_main_and_its_child_are_killed_and_reported(tmp_path: Path, preload: bool) -> None:
    root = make_book(
        tmp_path,
        {
            "examples/ch00_main.py": HANGING_MAIN,
            "chapters/ch00/manifest.toml": 'chapter = 0\ntitle = "zero"\n'
            'main = "examples/ch00_main.py"\n'
            'tests = ["tests/test_ch00_core.py"]\ncreates = ["minisgl/__init__.py", '
            '"minisgl/core.py"]\ntimeout = 8\n',
        },
    )
    keep = tmp_path / "kept"
    preloader = Preloader.start() if preload else None
    supervise.use_preloader(preloader)
    try:
        row = run_chapter(Book(root), 0, keep=keep)
    finally:
        supervise.use_preloader(None)
        if preloader is not None:
            preloader.stop()
    report = "\n".join(row.problems)
    assert "main examples/ch00_main.py ran past its 8 s" in report, report
    # each process is named with its command line and the stack where it waited
    assert "examples/ch00_main.py\n" in report and 'ch00_main.py", line 15 in <module>' in report
    assert "multiprocessing.spawn" in report and 'ch00_main.py", line 7 in wait_for_ever' in report
    (pid_file,) = keep.rglob("ch00_main.py.pid")
    child = int(pid_file.read_text())
    assert is_gone(child), f"the child {child} is still running"


@pytest.mark.parametrize("preload", [False, True], ids=["fresh", "preloaded"])
def test_a_run_started_at_a_lower_priority_passes_it_to_the_processes_it_starts(
    tmp_path: Path, preload: bool
) -> None:
    """The check runs a main beside the tests with `nice` (MAIN_NICE); the main's own workers,
    started later, inherit it."""
    script = tmp_path / "nice.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0))\n"
        "child = 'import os; print(os.getpriority(os.PRIO_PROCESS, 0))'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True)"
        ".stdout.strip())\n"
    )
    preloader = Preloader.start() if preload else None
    supervise.use_preloader(preloader)
    try:
        outcome = supervise.run([sys.executable, str(script)], tmp_path, dict(os.environ), 60, 7)
    finally:
        supervise.use_preloader(None)
        if preloader is not None:
            preloader.stop()
    assert outcome.returncode == 0, outcome.stderr
    own, child = (int(line) for line in outcome.stdout.split())
    assert own >= 7 and child == own


def test_a_main_that_leaves_a_process_running_fails(tmp_path: Path) -> None:
    main_text = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(sys.argv[0] + ".pid", "w") as f:
    f.write(str(child.pid))
print("{PARITY_OK}")
"""
    root = make_book(tmp_path, {"examples/ch00_main.py": main_text})
    keep = tmp_path / "kept"
    row = run_chapter(Book(root), 0, keep=keep, run_tests=False)
    report = "\n".join(row.problems)
    assert not row.ok and "left 1 process(es) running after it ended" in report, report
    (pid_file,) = keep.rglob("ch00_main.py.pid")
    assert is_gone(int(pid_file.read_text()))


def test_a_number_that_depends_on_the_machine_is_compared_within_its_tolerance(
    tmp_path: Path,
) -> None:
    book_toml = (
        'package = "minisgl"\nsupport = ["tests/support.py"]\n[prints]\n'
        "approx = [{ pattern = 'margin (?P<v>[\\d.]+)', abs = 0.002, why = 'float32 rounding' }]\n"
    )
    page = """
        # One
        <!-- prints: examples/ch01_main.py -->
        ```text
        double 4 took 0.9 s, margin 0.0520
        parity: models=1 prompts=2 tokens=10/10 min_margin=0.5000
        ```
        """
    for printed, ok in (("0.0519", True), ("0.0535", True), ("0.0560", False)):
        main_text = f"print('double 4 took 1.5 s, margin {printed}')\nprint('{PARITY_OK}')\n"
        root = make_book(
            tmp_path / printed,
            {
                "chapters/book.toml": book_toml,
                "docs/ch01.md": page,
                "examples/ch01_main.py": main_text,
            },
        )
        row = run_chapter(Book(root), 1, run_tests=False)
        assert row.ok == ok, (printed, row.problems)
        if not ok:
            assert (
                "0.0520 in the page, 0.0560 now (allowed: +-0.002; float32 rounding)"
                in row.problems[0]
            )


# ------------------------------------------------------------ carried-forward tests, selected
def test_a_carried_forward_test_reruns_only_where_something_it_reads_changed(
    tmp_path: Path,
) -> None:
    code, out = check(make_book(tmp_path))
    assert code == 0, out
    # chapter 01 changed VALUE, which test_ch00_core reads, so it reran there; chapter 02
    # changed only util.py
    assert out.count("not rerun") == 1, out
    assert f"{NOT_RERUN}: test_ch00_core.py (1)" in out
    # one chapter alone has no earlier chapter in its check: it runs everything
    code, out = check(make_book(tmp_path / "alone"), 2)
    assert code == 0 and "not rerun" not in out, out


SELECTION_BOOK = {
    "chapters/ch00/minisgl/ops.py": """
        class Registry(dict):
            def register(self, name):
                def add(f):
                    self[name] = f
                    return f
                return add

        BACKENDS = Registry()

        @BACKENDS.register("a")
        def make_a():
            return "a"

        def used(x):
            return x + 1

        def unused(x):
            return x * 2

        def in_a_worker(x):
            return x - 1
        """,
    "chapters/ch00/minisgl/side.py": "SIDE = 1\n",
    "minisgl/ops.py": """
        class Registry(dict):
            def register(self, name):
                def add(f):
                    self[name] = f
                    return f
                return add

        BACKENDS = Registry()

        @BACKENDS.register("a")
        def make_a():
            return "a"

        @BACKENDS.register("b")
        def make_b():
            return "b"

        def used(x):
            return x + 1

        def unused(x):  # a body no test runs
            return x * 3

        def in_a_worker(x):  # the same result, another body
            return x + 0 - 1
        """,
    "minisgl/side.py": "import sys\nsys.modules[__name__].SIDE = 2  # done at import\n",
    "tests/test_ch00_unused.py": """
        from minisgl.ops import used
        def test_used():
            assert used(1) == 2
        """,
    "tests/test_ch00_worker.py": """
        import subprocess, sys
        CODE = "from minisgl import ops; print(ops.in_a_worker(1))"
        def test_in_a_worker():
            out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True)
            assert out.stdout.strip() == "0", out.stderr
        """,
    "tests/test_ch00_killed.py": """
        import subprocess, sys
        CODE = "import time; from minisgl import ops; print(ops.in_a_worker(1), flush=True); " \\
               "time.sleep(600)"
        def test_a_worker_killed_outright():
            worker = subprocess.Popen([sys.executable, "-c", CODE], stdout=subprocess.PIPE)
            try:
                assert worker.stdout.readline().strip() == b"0"
            finally:
                worker.kill()  # SIGKILL: it cannot write its end
                worker.wait()
        def test_after_the_kill():
            assert sum([1, 1]) == 2
        """,
    "tests/test_ch00_registry.py": """
        from minisgl import ops
        def test_first_backend():
            assert ops.BACKENDS["a"]() == "a"
        """,
    "tests/test_ch00_side.py": """
        import minisgl.side
        def test_side():
            assert minisgl.side.SIDE in (1, 2)
        """,
    "chapters/ch00/manifest.toml": """
        chapter = 0
        title = "zero"
        main = "examples/ch00_main.py"
        tests = ["tests/test_ch00_core.py", "tests/test_ch00_unused.py",
                 "tests/test_ch00_worker.py", "tests/test_ch00_registry.py",
                 "tests/test_ch00_side.py", "tests/test_ch00_killed.py"]
        creates = ["minisgl/__init__.py", "minisgl/core.py", "minisgl/ops.py",
                   "minisgl/side.py"]
        """,
    "chapters/ch01/manifest.toml": """
        chapter = 1
        title = "one"
        page = "docs/ch01.md"
        main = "examples/ch01_main.py"
        tests = ["tests/test_ch01_util.py"]
        creates = ["minisgl/util.py"]
        modifies = ["minisgl/core.py", "minisgl/ops.py", "minisgl/side.py"]
        [prints]
        mask = ['took [\\d.]+ s']
        """,
}


def test_the_record_of_what_a_test_ran_decides_whether_it_reruns(tmp_path: Path) -> None:
    """Chapter 01 changes a function no test runs (test_ch00_unused is not rerun), the body of
    a function that only a worker process runs, an entry added to a registry, and a statement
    a module runs at import (those tests rerun). A worker killed outright counts for the test
    that ran while it lived, not for the tests after it."""
    keep = tmp_path / "kept"
    code, out = check(make_book(tmp_path, SELECTION_BOOK), 0, 1, "--keep", str(keep))
    assert code == 0, out
    assert f"{NOT_RERUN}: test_ch00_unused.py (1), test_ch00_killed.py (1)\n" in out, out
    why = {
        line.split("::")[0].removeprefix("tests/"): line.split(": ", 1)[1]
        for line in (keep / "ch01" / "selection.txt").read_text().splitlines()
    }
    assert why["test_ch00_worker.py"] == "in_a_worker (minisgl/ops.py) changed"
    assert why["test_ch00_killed.py"] == "in_a_worker (minisgl/ops.py) changed"
    assert "test_after_the_kill" not in (keep / "ch01" / "selection.txt").read_text()
    assert why["test_ch00_registry.py"].endswith("something else now: BACKENDS")
    assert why["test_ch00_side.py"].startswith("minisgl/side.py: a statement run at import")
    assert "test_ch00_unused.py" not in why


READS_BOOK = {
    "chapters/ch00/manifest.toml": """
        chapter = 0
        title = "zero"
        main = "examples/ch00_main.py"
        tests = ["tests/test_ch00_core.py", "tests/test_ch00_reads.py"]
        creates = ["minisgl/__init__.py", "minisgl/core.py"]
        """,
    "chapters/ch00/minisgl/core.py": "VALUE = 0\nENV = 0\n\ndef label():\n    return 'core'\n",
    "minisgl/core.py": "VALUE = 1\nENV = 1\n\ndef label():\n    return 'core'\n",
    "tests/test_ch00_reads.py": """
        from minisgl.core import VALUE, label

        ENV = {"x": 1}  # the file's own ENV, not minisgl.core's

        def _value():
            return VALUE

        def test_through_a_helper():
            assert _value() in (0, 1)

        def test_without_the_value():
            assert label() == "core" and ENV["x"] == 1
        """,
}


def test_a_test_reruns_for_a_name_only_if_its_own_code_reaches_it(tmp_path: Path) -> None:
    """Chapter 01 changes VALUE and ENV. Of two tests in a file that imports VALUE, the one
    whose helper reads it reruns; the other reads only the file's own ENV and is not rerun
    (before, a test file counted whole: every name it mentions, for each of its tests)."""
    keep = tmp_path / "kept"
    code, out = check(make_book(tmp_path, READS_BOOK), 0, 1, "--keep", str(keep))
    assert code == 0, out
    selection = (keep / "ch01" / "selection.txt").read_text()
    assert "test_ch00_reads.py::test_through_a_helper: it reads names that mean something " \
        "else now: VALUE" in selection, selection  # fmt: skip
    assert "test_without_the_value" not in selection, selection
    assert "test_ch00_reads.py (1)" in out, out


TOOLS_BOOK = {
    "chapters/book.toml": 'package = "minisgl"\n'
    'support = ["tests/support.py", "tools/__init__.py", "tools/old.py", "tools/later.py"]\n',
    "chapters/ch00/minisgl/core.py": "VALUE = 0\nOLD = 0\n",
    "tools/__init__.py": "",
    "tools/old.py": "from minisgl.core import OLD\n",  # chapter 01 removes OLD
    "tools/later.py": "from minisgl.later import LATER\n",  # a module no chapter here has
    "tests/test_ch00_core.py": """
        import minisgl.core
        def test_value():
            assert minisgl.core.VALUE in (0, 1)
        def _with_the_old_tool():
            import tools.old
        """,
    "tests/test_ch00_later.py": """
        def test_plain():
            assert 1 + 1 == 2
        def _with_the_later_tool():
            import tools.later
        """,
}


def test_an_import_of_a_later_chapters_module_does_not_rerun_a_test(tmp_path: Path) -> None:
    """A tool that imports a module a later chapter creates lacks it in every chapter before
    that one: a test whose files can import the tool reruns only where a name they import was
    there in its last chapter and is gone now (chapter 01 removes OLD from core.py)."""
    keep = tmp_path / "kept"
    book = make_book(tmp_path, TOOLS_BOOK)
    manifest = book / "chapters/ch00/manifest.toml"
    manifest.write_text(manifest.read_text().replace(
        '"tests/test_ch00_core.py"]', '"tests/test_ch00_core.py", "tests/test_ch00_later.py"]'
    ))  # fmt: skip
    code, out = check(book, 0, 1, "--keep", str(keep))
    assert code == 0, out
    selection = (keep / "ch01" / "selection.txt").read_text()
    assert "tools/old.py imports OLD from minisgl.core, which no longer has it" in selection
    assert "minisgl.later" not in selection and "test_ch00_later" not in selection, selection
    assert "test_ch00_later.py (1)" in out, out


def test_no_file_that_every_tree_shares_imports_the_package_at_its_top() -> None:
    """chapters/book.toml's support files are in every chapter's tree, and an earlier
    chapter lacks a later one's modules: a tool imports the package inside the function that
    needs it (tools/split_k.py once did at its top)."""
    from tools.outside import read_outside

    root = Path(__file__).resolve().parents[1]
    book = Book(root)
    files = []
    for rel in book.support:
        path = root / rel
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path] * rel.endswith(".py")
    assert len(files) > 10
    package = book.package
    for path in files:
        imports = read_outside(path.read_text(), path.relative_to(root).as_posix()).imports
        top = [m for m, _ in imports if m == package or m.startswith(package + ".")]
        assert not top, f"{path.relative_to(root)} imports {top} at its top"


def test_a_fix_that_never_reached_a_later_version_of_its_file_still_fails(tmp_path: Path) -> None:
    """Chapter 00's version of core.py has the fix its test checks; chapter 01's version of
    the same file lost it. The test reruns in chapter 01 (core.py changed) and fails there."""
    fixed = "import minisgl.core\n\ndef test_value():\n    assert minisgl.core.VALUE == 0\n"
    code, out = check(make_book(tmp_path, {"tests/test_ch00_core.py": fixed}))
    assert code != 0
    assert "chapter 00: zero: ok" in out and "chapter 01: one: FAILED" in out, out
    assert "test_ch00_core.py::test_value" in out


def test_deps_follow_imports_and_the_rules_for_what_the_source_does_not_spell_out(
    tmp_path: Path,
) -> None:
    from tools.deps import ImportGraph

    _write(
        tmp_path,
        {
            "minisgl/__init__.py": "",
            "minisgl/a.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from minisgl import b\n",
            "minisgl/b.py": "",
            "minisgl/models/__init__.py": "from .register import get\n",
            "minisgl/models/register.py": "import importlib\n"
            "def get(n):\n    return importlib.import_module(n, __package__)\n",
            "minisgl/models/qwen.py": "",
            "minisgl/kernel/__init__.py": "from .store import store\n",
            "minisgl/kernel/store.py": "def store():\n    from . import _impl\n",
            "minisgl/kernel/_impl.py": "",
            "minisgl/kernel/csrc/store.cu": "",
            "minisgl/__main__.py": "",
            "examples/ch01_main.py": "import minisgl.a\n",
            "tests/test_x.py": "from minisgl.kernel import store\nload('examples/ch01_main.py')\n"
            "cmd = ['python', '-m', 'minisgl']\n",
            "tests/test_y.py": "import minisgl.models\n",
        },
    )
    graph = ImportGraph(tmp_path, "minisgl")
    assert graph.package_dependencies(["tests/test_x.py"]) == {
        "minisgl/__init__.py",
        "minisgl/a.py",
        "minisgl/__main__.py",  # not b.py: TYPE_CHECKING
        "minisgl/kernel/__init__.py",
        "minisgl/kernel/store.py",
        "minisgl/kernel/_impl.py",
        "minisgl/kernel/csrc/store.cu",
    }
    assert graph.package_dependencies(["tests/test_y.py"]) == {
        "minisgl/__init__.py",
        "minisgl/models/__init__.py",
        "minisgl/models/register.py",
        "minisgl/models/qwen.py",  # a computed import_module: the whole package
    }


def test_new_opens_a_chapter_and_keeps_every_earlier_tree(tmp_path: Path) -> None:
    root = make_book(tmp_path)
    (root / "chapters" / "book.toml").write_text(
        (root / "chapters" / "book.toml").read_text()
        + '[[plan]]\nnumber = "03"\ntitle = "three"\nsummary = "quadruple the value"\n'
    )
    trees = {
        n: {p: f.read_bytes() for p, f in Book(root).package_files(n).items()} for n in (0, 1, 2)
    }
    assert (
        main(
            [
                "--root",
                str(root),
                "new",
                "3",
                "quad",
                "--modifies",
                "minisgl/util.py",
                "--creates",
                "minisgl/quad.py",
            ]
        )
        == 0
    )
    book = Book(root)
    for n, files in trees.items():  # every earlier chapter still sees exactly its own files
        assert {p: f.read_bytes() for p, f in book.package_files(n).items()} == files
    assert (
        root / "chapters/ch02/minisgl/util.py"
    ).read_text() == "def triple(x):\n    return 3 * x\n"
    assert book.chapter(3).title == "three" and book.chapter(3).modifies == ["minisgl/util.py"]
    problems = "\n".join(book.verify())
    assert "chapter 03 says it modifies minisgl/util.py, but its version is identical" in problems
    (root / "minisgl/util.py").write_text("def quadruple(x):\n    return 4 * x\n")
    assert Book(root).verify() == []


def test_a_refused_new_chapter_leaves_the_book_as_it_was(tmp_path: Path) -> None:
    """`new` checks every argument before it writes: a "creates" file that exists already is
    refused before any "modifies" file is moved into an earlier chapter's folder."""
    root = make_book(tmp_path)
    (root / "chapters" / "book.toml").write_text(
        (root / "chapters" / "book.toml").read_text()
        + '[[plan]]\nnumber = "03"\ntitle = "three"\nsummary = "quadruple the value"\n'
    )
    (root / "minisgl/quad.py").write_text("X = 1\n")  # written by hand, before `new`
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    argv = ["--root", str(root), "new", "3", "quad", "--modifies", "minisgl/util.py"]
    assert main([*argv, "--creates", "minisgl/quad.py"]) != 0
    after = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert after == before
    assert not (root / "chapters/ch02/minisgl/util.py").exists()


def test_a_tree_built_by_hand_imports_only_its_own_files(tmp_path: Path) -> None:
    """The README's `steps.py build 5 --out DIR && cd DIR && python examples/...`, with the
    repository installed in editable mode (as the set-up does): a module chapter 05 does not
    have must not come from the finished package."""
    root = Path(__file__).resolve().parents[1]
    tree = Book(root).build(5, tmp_path / "ch05")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MINISGL_BOOK_TREE")}
    probe = (
        "import sys; sys.path.insert(0, '.')\n"
        "import minisgl.core\n"
        "try:\n    import minisgl.scheduler\nexcept ModuleNotFoundError as e:\n    "
        "print('missing:', e)\n"
        "else:\n    print('LEAKED', minisgl.scheduler.__file__)\n"
        "print('core from', minisgl.core.__file__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "missing: No module named 'minisgl.scheduler'" in out, out
    assert f"core from {tree.resolve()}/minisgl/core.py" in out, out


def test_an_interrupted_check_stops_everything_it_started(tmp_path: Path) -> None:
    """SIGTERM (or Ctrl-C) to steps.py while a main hangs: steps.py stops within seconds, the
    main and its child, which run in a session of their own, are gone too, and so are the
    chapter's work folders."""
    import signal
    import time

    pid_file = tmp_path / "child.pid"
    hanging = HANGING_MAIN.replace('sys.argv[0] + ".pid"', repr(str(pid_file)))
    root = make_book(tmp_path / "book", {"examples/ch00_main.py": hanging})
    temp = tmp_path / "temp"  # where the check makes its work folders
    temp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "tools" / "steps.py"),
         "--root", str(root), "check", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the pid is written
        child = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "every process the check started is stopped" in out, out
    deadline = time.monotonic() + 10
    while not is_gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert is_gone(child)
    assert not [p.name for p in temp.iterdir() if p.name.startswith("minisgl-ch00-")]


def test_a_file_that_reran_some_of_its_tests_keeps_the_others(tmp_path: Path) -> None:
    """After a chapter reruns one test of a file, a later chapter whose change touches only
    that test reruns only it (the selector once forgot the file's other tests, and then ran
    the whole file, its one known test being all of it)."""
    from tools.selection import Selector

    def record(folder: Path, names: List[str]) -> Path:
        folder.mkdir()
        entry = {"ran": [], "fixtures": [], "start": 0.0, "end": 1.0, "outcome": "passed"}
        tests = {f"tests/test_x.py::{n}": entry for n in names}
        (folder / "tests.json").write_text(
            json.dumps({"collect": [], "fixtures": {}, "tests": tests})
        )
        return folder

    selector = Selector(SimpleNamespace())  # type: ignore[arg-type]
    selector.remember(record(tmp_path / "ch05", ["test_a", "test_b", "test_c"]), 5)
    selector.remember(record(tmp_path / "ch06", ["test_b"]), 6)
    assert selector.nodes["tests/test_x.py"] == [f"tests/test_x.py::test_{c}" for c in "abc"]
    assert selector.records["tests/test_x.py::test_b"].chapter == 6
    selector.remember(record(tmp_path / "ch07", ["test_a", "test_d"]), 7)  # collected anew
    assert selector.nodes["tests/test_x.py"] == [f"tests/test_x.py::test_{c}" for c in "ad"]


# ------------------------------------------------------------------------------ the projects
PLAN = "".join(
    f'[[plan]]\nnumber = "{n}"\ntitle = "{title}"\nsummary = "{title}, in short"\n'
    for n, title in [("00", "zero"), ("01", "one"), ("02", "two")]
    + [(f"P{k}", f"project {k}") for k in range(1, 7)]
)
PROJECT_BOOK: Dict[str, Optional[str]] = {
    "chapters/book.toml": 'package = "minisgl"\nsupport = ["tests/support.py"]\n'
    'parts = [\n    { name = "Start", chapters = ["00", "01", "02"] },\n'
    '    { name = "Projects", chapters = ["P1", "P2", "P3", "P4", "P5", "P6"] },\n]\n' + PLAN,
    # project P1 comes after chapter 02: it creates quad.py and adds quadruple() to util.py
    "chapters/p1/manifest.toml": """
        chapter = "P1"
        title = "project 1"
        page = "docs/p1.md"
        main = "examples/p1_main.py"
        tests = ["tests/test_p1_quad.py"]
        creates = ["minisgl/quad.py"]
        modifies = ["minisgl/util.py"]
        [[exercise]]
        id = "p1-quadruple"
        file = "minisgl/util.py"
        function = "quadruple"
        tests = ["tests/test_p1_quad.py::test_quad"]
        """,
    "chapters/ch02/minisgl/util.py": "def triple(x):\n    return 3 * x\n",
    "minisgl/util.py": "def triple(x):\n    return 3 * x\n\n\n"
    "def quadruple(x):\n    return 4 * x\n",
    "minisgl/quad.py": "from minisgl.util import quadruple\n\nQUAD = quadruple(1)\n",
    "examples/p1_main.py": f"""
        from minisgl.quad import QUAD
        print("quad", QUAD)
        print("{PARITY_OK}")
        """,
    "tests/test_p1_quad.py": """
        from minisgl.quad import QUAD
        def test_quad():
            assert QUAD == 4
        """,
    "docs/p1.md": f"""
        # P1 · project 1

        <!-- tree[P1] -->

        <!-- code[P1]: minisgl/util.py::quadruple -->

        ## What it prints

        <!-- prints: examples/p1_main.py -->
        ```text
        quad 4
        {PARITY_OK}
        ```
        """,
}


def make_project_book(root: Path, overrides: Dict[str, Optional[str]] | None = None) -> Path:
    """make_book's three chapters, then project P1 (and the whole plan in book.toml)."""
    return make_book(root, {**PROJECT_BOOK, **(overrides or {})})


def test_a_chapter_is_named_by_its_number_and_a_project_by_its_label() -> None:
    from tools.book import (
        PROJECT_BASE,
        ChapterNameError,
        chapter_arg,
        chapter_name,
        folder_of,
        label_of,
        parse_chapter,
    )

    assert [parse_chapter(s) for s in ("0", "7", "07", "22", " 9 ")] == [0, 7, 7, 22, 9]
    assert [parse_chapter(s) for s in ("P1", "p1", "P6")] == [
        PROJECT_BASE + 1,
        PROJECT_BASE + 1,
        PROJECT_BASE + 6,
    ]
    for bad in ("P0", "P7", "p", str(PROJECT_BASE + 1), "-1", "x", "", "7.0", "ch07", "²"):
        with pytest.raises(ChapterNameError, match="names no chapter: a chapter is 0 to"):
            parse_chapter(bad)
    rows = [(label_of(n), chapter_name(n), chapter_arg(n), folder_of(n)) for n in (0, 7, 23, 28)]
    assert rows == [
        ("00", "chapter 00", "0", "ch00"),
        ("07", "chapter 07", "7", "ch07"),
        ("P1", "project P1", "P1", "p1"),
        ("P6", "project P6", "P6", "p6"),
    ]
    assert all(parse_chapter(chapter_arg(n)) == n for n in range(PROJECT_BASE + 7))


def test_the_plan_has_the_chapters_and_projects_the_tools_count_on() -> None:
    """PROJECT_BASE is the plan's last numbered chapter: P1 sorts right after it."""
    from tools.book import PROJECT_BASE, PROJECT_COUNT, tomllib

    root = Path(__file__).resolve().parents[1]
    plan = tomllib.loads((root / "chapters" / "book.toml").read_text())["plan"]
    numbers = [item["number"] for item in plan]
    chapters = [n for n in numbers if n.isdigit()]
    assert chapters == [f"{n:02d}" for n in range(PROJECT_BASE + 1)]
    assert numbers[len(chapters) :] == [f"P{k}" for k in range(1, PROJECT_COUNT + 1)]


def test_a_project_comes_after_the_chapters_and_builds_like_one(tmp_path: Path, capsys) -> None:
    from tools.book import PROJECT_BASE

    root = make_project_book(tmp_path / "book")
    book = Book(root)
    p1 = PROJECT_BASE + 1
    assert [m.label for m in book.chapters] == ["00", "01", "02", "P1"]
    assert book.last.number == p1 and book.last.name == "project P1"
    assert book.last.slug == "p1" and book.previous(p1).label == "02"
    assert book.verify() == []
    assert "minisgl/quad.py" not in book.package_files(2)
    assert book.package_files(2)["minisgl/util.py"] == root / "chapters/ch02/minisgl/util.py"
    assert book.tests_at(p1)[-1] == "tests/test_p1_quad.py"

    assert main(["--root", str(root), "build", "P1", "--out", str(tmp_path / "tp")]) == 0
    assert f"project P1's tree is in {tmp_path / 'tp'}" in capsys.readouterr().out
    assert main(["--root", str(root), "build", "p1", "--out", str(tmp_path / "tp2")]) == 0
    files = sorted(p.relative_to(tmp_path / "tp").as_posix() for p in (tmp_path / "tp").rglob("*"))
    assert "minisgl/quad.py" in files and "examples/p1_main.py" in files
    assert "tests/test_p1_quad.py" in files and "tests/test_ch01_util.py" not in files  # retired
    assert "quadruple" in (tmp_path / "tp" / "minisgl" / "util.py").read_text()
    assert (tmp_path / "tp2" / "minisgl" / "util.py").read_bytes() == (
        root / "minisgl" / "util.py"
    ).read_bytes()

    assert main(["--root", str(root), "diff", "2", "P1"]) == 0
    out = capsys.readouterr().out
    assert "--- ch02/minisgl/util.py\n+++ p1/minisgl/util.py" in out
    assert "--- /dev/null\n+++ p1/minisgl/quad.py" in out
    assert main(["--root", str(root), "list"]) == 0
    assert "\nP1  project 1\n      creates  minisgl/quad.py\n" in capsys.readouterr().out


def test_a_chapter_argument_that_names_nothing_is_refused_clearly(tmp_path: Path, capsys) -> None:
    root = make_project_book(tmp_path / "book")
    for argv in (["build", "P9", "--out", str(tmp_path / "t")], ["diff", "2", "x"]):
        with pytest.raises(SystemExit) as stop:
            main(["--root", str(root), *argv])
        assert stop.value.code == 2
        assert "names no chapter: a chapter is 0 to 22 (7 or 07), a project P1 to P6" in (
            capsys.readouterr().err
        )
    assert main(["--root", str(root), "build", "P2", "--out", str(tmp_path / "t")]) == 2
    assert "error: no project P2 in this book; it has 00, 01, 02, P1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, message",
    [
        (  # a project's manifest in a chapter's folder
            {
                "chapters/p1/manifest.toml": None,
                "chapters/ch23/manifest.toml": 'chapter = "P1"\n'
                'title = "project 1"\nmain = "examples/p1_main.py"\n',
            },  # fmt: skip
            "says project P1: its folder must be chapters/p1",
        ),
        (  # a chapter numbered past the last chapter of the plan
            {"chapters/ch23/manifest.toml": 'chapter = 23\ntitle = "x"\nmain = "x.py"\n'},
            "chapter = 23: '23' names no chapter",
        ),
        (  # a project past the plan's six
            {"chapters/p7/manifest.toml": 'chapter = "P7"\ntitle = "x"\nmain = "x.py"\n'},
            "chapter = 'P7': 'P7' names no chapter",
        ),
    ],
    ids=["project-in-chapter-folder", "chapter-23", "project-7"],
)
def test_a_project_in_the_wrong_place_is_refused(
    tmp_path: Path, overrides: Dict[str, Optional[str]], message: str
) -> None:
    from tools.book import BookError

    root = make_project_book(tmp_path, overrides)
    with pytest.raises(BookError, match=re.escape(message)):
        Book(root)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"minisgl/util.py": "def triple(x):\n    return 3 * x\n"},
            "project P1 says it modifies minisgl/util.py, but its version is identical to "
            "chapter 02's",
        ),
        (
            {"tests/test_p1_orphan.py": "def test_x():\n    pass\n"},
            "tests/test_p1_orphan.py is not named by any chapter's manifest",
        ),
        (
            {"chapters/p1/minisgl/util.py": "X = 1\n"},
            "chapters/p1/minisgl/util.py should not be there: its last version belongs in the "
            "package folder",
        ),
    ],
    ids=["modifies-unchanged", "orphan-test", "final-in-project-folder"],
)
def test_a_project_whose_manifest_lies_is_caught(
    tmp_path: Path, overrides: Dict[str, Optional[str]], message: str
) -> None:
    root = make_project_book(tmp_path, overrides)
    assert message in "\n".join(Book(root).verify())


def test_a_project_test_file_is_named_after_the_project(tmp_path: Path) -> None:
    manifest = PROJECT_BOOK["chapters/p1/manifest.toml"]
    assert manifest is not None
    root = make_project_book(
        tmp_path,
        {
            "chapters/p1/manifest.toml": manifest.replace("test_p1_quad", "test_ch23_quad"),
            "tests/test_ch23_quad.py": PROJECT_BOOK["tests/test_p1_quad.py"],
            "tests/test_p1_quad.py": None,
        },
    )
    problems = "\n".join(Book(root).verify())
    assert "project P1's test file tests/test_ch23_quad.py should be named test_p1_*.py" in problems


def test_check_runs_a_project_and_names_it_in_every_message(tmp_path: Path) -> None:
    """`steps.py check 0 P1`: the project runs in its own tree like a chapter; chapter 00's
    main, importing the project's module, is told which project creates it."""
    root = make_project_book(
        tmp_path, {"examples/ch00_main.py": f"import minisgl.quad\nprint('{PARITY_OK}')\n"}
    )
    code, out = check(root, 0, "P1")
    assert code != 0
    assert "manifests: 4 chapters, 4 package files in the last tree; consistent" in out
    assert "chapter 00 imports minisgl.quad, which only project P1 creates" in out
    assert "(bring the file in early, or move the code to project P1)" in out
    assert "chapter 00: zero: FAILED" in out and "project P1: project 1: ok" in out, out
    rows = [line.split() for line in out.splitlines() if line[:3] in ("00 ", "P1 ")]
    assert [r[0] for r in rows] == ["00", "P1"] and rows[1][1:5] == ["4", "ok", "3", "passed"], out


def test_a_test_that_failed_in_a_project_reruns_in_the_next_one(tmp_path: Path) -> None:
    """Project P2 adds nothing; P1's test failed in P1, so P2 reruns it and says why."""
    root = make_project_book(
        tmp_path,
        {
            "tests/test_p1_quad.py": "def test_quad():\n    assert False\n",
            "chapters/p2/manifest.toml": 'chapter = "P2"\ntitle = "project 2"\n'
            'main = "examples/p2_main.py"\ntests = ["tests/test_p2_none.py"]\n',
            "examples/p2_main.py": f"print('{PARITY_OK}')\n",
            "tests/test_p2_none.py": "def test_none():\n    pass\n",
        },
    )
    keep = tmp_path / "kept"
    code, out = check(root, "P1", "p2", "--jobs", "1", "--keep", str(keep))
    assert code != 0 and "project P1: project 1: FAILED" in out, out
    assert (keep / "p2" / "selection.txt").read_text() == (
        "tests/test_p1_quad.py::test_quad: it failed in project P1\n"
    )


def test_new_opens_a_project_after_the_last_chapter(tmp_path: Path) -> None:
    from tools.book import PROJECT_BASE

    root = make_project_book(tmp_path)
    argv = ["--root", str(root), "new", "p2", "spec", "--creates", "minisgl/spec.py"]
    assert main(argv) == 0
    book = Book(root)
    p2 = book.chapter(PROJECT_BASE + 2)
    assert (p2.label, p2.folder, p2.title) == ("P2", root / "chapters" / "p2", "project 2")
    assert (root / "chapters/p2/manifest.toml").read_text().startswith('chapter = "P2"\n')
    assert (p2.main, p2.tests, p2.page) == (
        "examples/p2_spec.py",
        ["tests/test_p2_spec.py"],
        "docs/chapters/p2-spec.md",
    )
    page = (root / p2.page).read_text()
    assert page.startswith("# P2 · project 2\n") and "<!-- tree[P2] -->" in page
    assert '"""Project P2: project 2.' in (root / p2.main).read_text()
    assert (
        root / "minisgl/spec.py"
    ).read_text() == '"""(project P2: say what this module holds)"""\n'
    assert main(["--root", str(root), "new", "2", "late"]) == 2  # before the last one


def test_exercises_name_a_project_by_its_label(tmp_path: Path) -> None:
    root = make_project_book(tmp_path)
    listed = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "tools" / "exercise.py"),
         "--root", str(root), "list"],
        capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert listed == f"{'p1-quadruple':24s} project P1  quadruple in minisgl/util.py\n"


def test_reading_stored_references_waits_for_no_lock() -> None:
    """The check runs mains and tests side by side; one of them may hold a model's lock for a
    minute while it computes references of its own. One that only reads stored references
    must not wait for it."""
    import threading

    from tools.models import cache_dir, file_lock
    from tools.parity import hf_references

    expected = hf_references("tiny-qwen3", [[1, 2, 3]], 2)  # stored now, if it was not
    got: List[object] = []
    with file_lock(cache_dir() / "references" / "tiny-qwen3.lock"):  # as one that computes
        reader = threading.Thread(
            target=lambda: got.append(hf_references("tiny-qwen3", [[1, 2, 3]], 2)), daemon=True
        )
        reader.start()
        reader.join(10)
    assert got == [expected]
