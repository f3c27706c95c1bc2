"""The command line of the figures: ``python -m tools.figures [NAME ...] [--out FOLDER]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.figures import DEFAULT_OUT, FIGURES, generate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.figures",
        description="Draw the handbook's figures as SVG, with the standard library only.",
    )
    parser.add_argument(
        "names", nargs="*", help=f"figures to write (default: all of {', '.join(FIGURES)})"
    )
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="output folder (default: docs/figures)"
    )
    args = parser.parse_args(argv)
    for path in generate(args.out, args.names or None):
        try:
            shown = path.resolve().relative_to(Path.cwd())
        except ValueError:
            shown = path
        print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
