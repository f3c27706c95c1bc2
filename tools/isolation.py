"""The environment of a chapter's run: only that chapter's tree is importable as ``minisgl``.

`isolated_env` puts ``tools/guard/`` (its ``sitecustomize.py`` enforces the isolation in
every Python process of the run) and the tree on PYTHONPATH, and drops what could bring in
another copy of the package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional

from tools.book import chapter_arg

GUARD_DIR = Path(__file__).resolve().parent / "guard"


def isolated_env(
    package: str, number: int, tree: Path, threads: Optional[int] = None
) -> Dict[str, str]:
    """The environment for running chapter `number`'s tree at `tree`. `threads` caps the
    BLAS and OpenMP threads of each process (chapters checked side by side)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(GUARD_DIR), str(tree)]),
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        MINISGL_BOOK_TREE=str(tree),
        MINISGL_BOOK_PACKAGE=package,
        MINISGL_BOOK_CHAPTER=chapter_arg(number),  # 7, or P1 for a project
    )
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env
