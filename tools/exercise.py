"""Exercises: write one function of the engine yourself, and let the chapter's tests judge it.

python tools/exercise.py list             every exercise, by chapter
python tools/exercise.py start ID         a workspace (exercises/ID/) holding the chapter's
                                          tree, with that function's body removed
python tools/exercise.py check ID         run the chapter's tests on your workspace
python tools/exercise.py verify [ID ...]  prove each exercise is real: without the body the
                                          chapter's tests fail, with the book's body they pass
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: `python tools/exercise.py`
    sys.path.insert(0, str(REPO_ROOT))

from tools import supervise  # noqa: E402
from tools.book import Book, BookError, Exercise, Manifest, folder_of  # noqa: E402
from tools.isolation import isolated_env  # noqa: E402
from tools.preload import Preloader  # noqa: E402

MARKER = "NotImplementedError"


def find_exercise(book: Book, exercise_id: str) -> Tuple[Manifest, Exercise]:
    for chapter in book.chapters:
        for ex in chapter.exercises:
            if ex.id == exercise_id:
                return chapter, ex
    known = [ex.id for c in book.chapters for ex in c.exercises]
    raise BookError(f"no exercise {exercise_id!r}; known: {', '.join(known)}")


def _find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    scope: List[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        found = None
        for node in scope:
            wanted = (
                (ast.FunctionDef, ast.AsyncFunctionDef) if i == len(parts) - 1 else ast.ClassDef
            )
            if isinstance(node, wanted) and node.name == part:
                found = node
        if found is None:
            raise BookError(f"{qualname} not found (no {part!r})")
        if isinstance(found, ast.ClassDef):
            scope = found.body
        else:
            return found
    raise BookError(f"{qualname} names a class, not a function")


def blank_function(source: str, qualname: str, exercise_id: str, hint: str) -> str:
    """Replace the body of `qualname` (keeping its docstring) by a NotImplementedError."""
    func = _find_function(ast.parse(source), qualname)
    body = func.body
    has_doc = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    first = body[1] if has_doc and len(body) > 1 else body[0]
    if first.lineno == func.lineno:
        raise BookError(f"{qualname}: the body must start on its own line")
    lines = source.splitlines(keepends=True)
    indent = " " * first.col_offset
    start = first.lineno - 1 if not (has_doc and len(body) == 1) else body[0].end_lineno
    end = body[-1].end_lineno  # 1-based, inclusive
    message = f"exercise {exercise_id}: write the body of {qualname}"
    stub = [f"{indent}# {hint}\n"] if hint else []
    stub.append(f"{indent}raise {MARKER}({message!r})\n")
    if _is_generator(func):  # still a generator, so that its caller reaches the raise
        stub.append(f"{indent}yield  # (the body is a generator: write it so)\n")
    return "".join(lines[:start] + stub + lines[end:])


def _is_generator(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether `yield` appears in the function's own body (not in a nested function)."""
    pending: List[ast.AST] = list(func.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))
    return False


def start_workspace(book: Book, exercise_id: str, out: Path) -> Path:
    chapter, ex = find_exercise(book, exercise_id)
    if out.exists():
        raise BookError(f"{out} exists already; remove it to start over")
    book.build(chapter.number, out)
    target = out / ex.file
    target.write_text(blank_function(target.read_text(), ex.function, ex.id, ex.hint))
    return target


TESTS_TIMEOUT_S = 600


def run_tests(
    book: Book,
    number: int,
    tree: Path,
    tests: List[str],
    stop_early: bool = False,
    threads: Optional[int] = None,
) -> supervise.Outcome:
    env = isolated_env(book.package, number, tree, threads)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *supervise.PYTEST_ONE_PROCESS,
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tree),
        *(["-x"] if stop_early else []),
        *tests,
    ]
    return supervise.run(cmd, tree, env, TESTS_TIMEOUT_S)


@dataclass
class Verdict:
    exercise: Exercise
    chapter: int
    blank_fails: bool
    solution_passes: bool
    detail: str = ""

    @property
    def real(self) -> bool:
        return self.blank_fails and self.solution_passes


def verify(book: Book, ids: Optional[List[str]] = None, jobs: int = 1) -> List[Verdict]:
    """For each exercise: its tests fail on the blanked tree (with our NotImplementedError)
    and pass on the chapter's own tree. `jobs` chapters are verified side by side, each
    process with one thread when there are several."""
    chosen = [(c, ex) for c in book.chapters for ex in c.exercises if not ids or ex.id in ids]
    if ids:
        missing = set(ids) - {ex.id for _, ex in chosen}
        if missing:
            raise BookError(f"unknown exercises: {sorted(missing)}")
    by_chapter: Dict[int, List[Exercise]] = {}
    for c, ex in chosen:
        by_chapter.setdefault(c.number, []).append(ex)
    threads = 1 if jobs > 1 else None
    preloader = Preloader.start()  # ~50 test runs, each spared 4 s of imports
    supervise.use_preloader(preloader)
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [
                pool.submit(_verify_chapter, book, number, exercises, threads)
                for number, exercises in by_chapter.items()
            ]
            return [verdict for future in futures for verdict in future.result()]
    finally:
        supervise.use_preloader(None)
        preloader.stop()


def _verify_chapter(
    book: Book, number: int, exercises: List[Exercise], threads: Optional[int]
) -> List[Verdict]:
    verdicts: List[Verdict] = []
    work = Path(tempfile.mkdtemp(prefix=f"minisgl-exercise-{folder_of(number)}-"))
    try:
        solution = book.build(number, work / "solution")
        wanted = sorted({t for ex in exercises for t in ex.tests})
        solved = run_tests(book, number, solution, wanted, threads=threads)
        for ex in exercises:
            blank = work / ex.id
            shutil.copytree(solution, blank)
            target = blank / ex.file
            target.write_text(blank_function(target.read_text(), ex.function, ex.id, ex.hint))
            result = run_tests(book, number, blank, ex.tests, stop_early=True, threads=threads)
            output = result.stdout + result.stderr
            blank_fails = result.returncode != 0 and ex.id in output and MARKER in output
            detail = "" if blank_fails else output[-2000:]
            if solved.returncode != 0:
                detail += (solved.stdout + solved.stderr)[-2000:]
            verdicts.append(Verdict(ex, number, blank_fails, solved.returncode == 0, detail))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return verdicts


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="The book's exercises.")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    p_start = sub.add_parser("start")
    p_start.add_argument("id")
    p_start.add_argument("--dir", type=Path, help="workspace folder (default exercises/ID)")
    p_check = sub.add_parser("check")
    p_check.add_argument("id")
    p_check.add_argument("--dir", type=Path)
    p_verify = sub.add_parser("verify")
    p_verify.add_argument("ids", nargs="*")
    p_verify.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="chapters verified side by side (default: 2, or 1 on one core)",
    )
    args = parser.parse_args(argv)
    try:
        book = Book(args.root)
        if args.command == "list":
            for c in book.chapters:
                for ex in c.exercises:
                    print(f"{ex.id:24s} {c.name}  {ex.function} in {ex.file}")
            return 0
        if args.command == "verify":
            verdicts = verify(book, args.ids or None, args.jobs)
            for v in verdicts:
                state = "real" if v.real else "NOT REAL"
                print(
                    f"{v.exercise.id:24s} {folder_of(v.chapter)}  blanked: "
                    f"{'fails' if v.blank_fails else 'PASSES'}  book's body: "
                    f"{'passes' if v.solution_passes else 'FAILS'}  -> {state}"
                )
                if not v.real:
                    print(v.detail)
            print(f"{sum(v.real for v in verdicts)}/{len(verdicts)} exercises verified")
            return 0 if all(v.real for v in verdicts) else 1
        chapter, ex = find_exercise(book, args.id)
        workspace = args.dir or book.root / "exercises" / ex.id
        if args.command == "start":
            target = start_workspace(book, ex.id, workspace)
            print(f"Exercise {ex.id} ({chapter.name}: {chapter.title})")
            print(f"  write the body of {ex.function} in {target}")
            if ex.hint:
                print(f"  hint: {ex.hint}")
            where = f" --dir {args.dir}" if args.dir else ""
            print(f"  then run: python tools/exercise.py check {ex.id}{where}")
            return 0
        if args.command == "check":
            if not workspace.exists():
                raise BookError(
                    f"no workspace at {workspace}; run: python tools/exercise.py start {ex.id}"
                )
            result = run_tests(book, chapter.number, workspace, chapter.tests)
            sys.stdout.write(result.stdout[-6000:])
            for problem in result.report("the tests", TESTS_TIMEOUT_S):
                print(problem)
            print("solved: the chapter's tests pass" if result.returncode == 0 else "not yet")
            return 0 if result.returncode == 0 else 1
    except BookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
