"""``python -m tools.animations [NAME ...] [--out FOLDER]``: record the animations."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from tools.animations import DEFAULT_OUT, generate, names


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.animations", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"default: all of {', '.join(names())}")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    from pathlib import Path

    for path in generate(Path(args.out), args.names or None):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
