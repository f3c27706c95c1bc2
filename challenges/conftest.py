"""The checkers of the challenges judge the module that $BOOK_CHALLENGE_FILE names (a
reader's file); without it, the book's reference solution."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def candidate(request):
    folder = Path(request.fspath).parent
    path = Path(os.environ.get("BOOK_CHALLENGE_FILE") or folder / "solution.py")
    spec = importlib.util.spec_from_file_location(f"challenge_{folder.name}", path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a reader's dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
