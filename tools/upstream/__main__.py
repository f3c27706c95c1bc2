"""``python -m tools.upstream diff ...`` / ``python -m tools.upstream api ...``."""

from __future__ import annotations

import sys

from tools.upstream.cli import main

if __name__ == "__main__":
    sys.exit(main())
