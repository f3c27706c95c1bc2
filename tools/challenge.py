"""Challenges: open-ended pieces of the engine to design yourself, judged by a checker.

python tools/challenge.py list            every challenge, with the chapter it builds on
python tools/challenge.py start ID        copy its starter to my-challenges/ID/ (your file)
python tools/challenge.py check ID [FILE] run its checker on your file
python tools/challenge.py verify [ID ...] prove each checker is real: the book's reference
                                          solution passes it and the starter fails it

A challenge lives in challenges/ID/: README.md (the task), challenge.toml (title, chapter,
the file you write, the checker), starter.py, solution.py (the book's answer) and the checker,
a pytest file that judges the module $BOOK_CHALLENGE_FILE names.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools.book import chapter_name, parse_chapter, tomllib  # noqa: E402
from tools.supervise import PYTEST_ONE_PROCESS  # noqa: E402

FOLDER = REPO_ROOT / "challenges"
WORKSPACE = REPO_ROOT / "my-challenges"
CHECK_SECONDS = 600


@dataclass
class Challenge:
    id: str
    title: str
    chapter: int
    file: str  # the name of the module the reader writes
    checker: Path
    summary: str

    @property
    def folder(self) -> Path:
        return self.checker.parent

    @property
    def task(self) -> str:
        return (self.folder / "README.md").read_text()


def challenges() -> List[Challenge]:
    found = []
    for toml in sorted(FOLDER.glob("*/challenge.toml")):
        data = tomllib.loads(toml.read_text())
        needed = ["README.md", "starter.py", "solution.py", data.get("checker", "(checker)")]
        missing = [name for name in needed if not (toml.parent / name).exists()]
        if missing:
            raise SystemExit(f"challenge {toml.parent.name}: missing {', '.join(missing)}")
        found.append(
            Challenge(
                id=toml.parent.name,
                title=data["title"],
                chapter=parse_chapter(data["chapter"]),  # 7, or "P1" for a project
                file=data["file"],
                checker=toml.parent / data["checker"],
                summary=data["summary"],
            )
        )
    return sorted(found, key=lambda c: (c.chapter, c.id))


def find(challenge_id: str) -> Challenge:
    for c in challenges():
        if c.id == challenge_id:
            return c
    known = ", ".join(c.id for c in challenges())
    raise SystemExit(f"no challenge {challenge_id!r}; known: {known}")


def run_checker(challenge: Challenge, candidate: Path, quiet: bool = False) -> int:
    """pytest on the checker, judging `candidate`; its exit code (0: every test passed)."""
    env = {**os.environ, "BOOK_CHALLENGE_FILE": str(candidate.resolve())}
    command = [sys.executable, "-m", "pytest", *PYTEST_ONE_PROCESS, "-q", "-p", "no:cacheprovider"]
    command.append("-x")
    if quiet:
        command.append("--no-header")
    try:
        done = subprocess.run(
            [*command, str(challenge.checker)],
            cwd=REPO_ROOT,
            env=env,
            timeout=CHECK_SECONDS,
            capture_output=quiet,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        print(f"{challenge.id}: the checker ran past {CHECK_SECONDS} s")
        return 124
    return done.returncode


def cmd_list() -> int:
    for c in challenges():
        print(f"{c.id:24s} after {chapter_name(c.chapter)}  {c.title}")
    return 0


def cmd_start(challenge_id: str) -> int:
    c = find(challenge_id)
    target = WORKSPACE / c.id / c.file
    if target.exists():
        print(f"{target.relative_to(REPO_ROOT)} exists already: it is yours, left as it is")
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(c.folder / "starter.py", target)
    shutil.copyfile(c.folder / "README.md", target.parent / "README.md")
    print(f"write {target.relative_to(REPO_ROOT)}; the task is in README.md beside it")
    print(f"then: python tools/challenge.py check {c.id}")
    return 0


def cmd_check(challenge_id: str, file: Optional[Path]) -> int:
    c = find(challenge_id)
    candidate = file or WORKSPACE / c.id / c.file
    if not candidate.exists():
        raise SystemExit(f"{candidate} does not exist: python tools/challenge.py start {c.id}")
    code = run_checker(c, candidate)
    print(f"\n{c.id}: {'passed' if code == 0 else 'not yet'} ({candidate})")
    return code


def cmd_verify(ids: List[str]) -> int:
    chosen = [find(i) for i in ids] if ids else challenges()
    failed = 0
    for c in chosen:
        with_solution = run_checker(c, c.folder / "solution.py", quiet=True)
        with_starter = run_checker(c, c.folder / "starter.py", quiet=True)
        real = with_solution == 0 and with_starter == 1  # 1: tests ran, and some failed
        failed += not real
        print(
            f"{c.id:24s} reference solution: {'passes' if with_solution == 0 else 'FAILS'}; "
            f"starter: {'fails' if with_starter == 1 else f'exit code {with_starter} (must fail)'}"
            f"  {'ok' if real else 'NOT REAL'}"
        )
    print(f"{len(chosen) - failed} of {len(chosen)} challenges are real")
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="The book's challenges.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    start = sub.add_parser("start")
    start.add_argument("id")
    check = sub.add_parser("check")
    check.add_argument("id")
    check.add_argument("file", nargs="?", type=Path, help="default: my-challenges/ID/FILE")
    verify = sub.add_parser("verify")
    verify.add_argument("ids", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "list":
        return cmd_list()
    if args.command == "start":
        return cmd_start(args.id)
    if args.command == "check":
        return cmd_check(args.id, args.file)
    return cmd_verify(args.ids)


if __name__ == "__main__":
    sys.exit(main())
