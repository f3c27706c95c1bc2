"""The command line: `build_parser` (the ``diff`` and ``api`` subcommands and their options),
`run` and `main` (exit status 2 for an `UpstreamError`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.upstream.api_compare import api_report, count_statuses, format_api
from tools.upstream.api_read import Level
from tools.upstream.diff import diff_report, format_diff
from tools.upstream.git import PINNED_COMMIT, UPSTREAM_URL, UpstreamError
from tools.upstream.sides import REPO_ROOT, UPSTREAM_PACKAGE, open_upstream, our_tree


def _chapter(text: str) -> int:
    """--chapter's value: 7, 07, or a project such as P1 (tools/book.py reads it)."""
    from tools.book import parse_chapter

    return parse_chapter(text)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--upstream",
        metavar="PATH_OR_URL",
        default=os.environ.get("MINISGL_UPSTREAM", UPSTREAM_URL),
        help="a mini-sglang checkout, a bare git dir, or a git URL to clone "
        "(default: $MINISGL_UPSTREAM, else %(default)s)",
    )
    common.add_argument(
        "--commit",
        default=PINNED_COMMIT,
        help="upstream commit to read (default: the pinned %(default)s)",
    )
    common.add_argument(
        "--chapter",
        type=_chapter,
        metavar="N",
        help="compare chapter N's (or project Pk's) package (from tools/steps.py), not minisgl/",
    )
    common.add_argument(
        "--repo-root",
        type=Path,
        default=REPO_ROOT,
        metavar="DIR",
        help="the book's repository (default: the one that holds this tool)",
    )
    common.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where URL clones go (default: $MINISGL_BOOK_CACHE/upstream, "
        "else ~/.cache/minisgl-book/upstream)",
    )
    common.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="package files or folders: core.py, minisgl/engine/ (default: all)",
    )

    parser = argparse.ArgumentParser(
        prog="python -m tools.upstream",
        description="Compare our minisgl/ (or a chapter's) with upstream mini-sglang's "
        f"{UPSTREAM_PACKAGE}/ at the pinned commit {PINNED_COMMIT[:12]}.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_diff = sub.add_parser(
        "diff",
        parents=[common],
        help="unified diff, upstream -> ours",
        description="Unified diff of each file, upstream (old) -> ours (new).",
    )
    p_diff.add_argument(
        "-U",
        "--context",
        type=int,
        default=3,
        metavar="N",
        help="lines of context (default: %(default)s)",
    )
    p_diff.add_argument("--stat", action="store_true", help="only the per-file summary lines")
    p_api = sub.add_parser(
        "api",
        parents=[common],
        help="public API table, read with ast",
        description="Public classes, functions, methods and fields of each "
        "module, compared by name and signature.",
    )
    level = p_api.add_mutually_exclusive_group()
    level.add_argument("--names-only", action="store_true", help="compare names only")
    level.add_argument(
        "--strict",
        action="store_true",
        help="compare annotations too (typing spellings normalised)",
    )
    p_api.add_argument("--hide-match", action="store_true", help="leave out the 'match' rows")
    p_api.add_argument(
        "--fail-on-missing", action="store_true", help="exit 1 when upstream has API that we lack"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    upstream = open_upstream(args.upstream, args.commit, args.cache_dir)
    ours = our_tree(args.repo_root.resolve(), args.chapter)
    if args.command == "diff":
        report = diff_report(ours, upstream, args.files, args.context)
        sys.stdout.write(format_diff(report, ours, upstream, args.stat))
        return 0
    level: Level = "names" if args.names_only else "strict" if args.strict else "shape"
    modules = api_report(ours, upstream, args.files, level)
    sys.stdout.write(format_api(modules, level, args.hide_match))
    return 1 if args.fail_on_missing and count_statuses(modules)["missing"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = run(args)
        sys.stdout.flush()  # a closed pipe shows up here, not at exit
        return status
    except UpstreamError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
