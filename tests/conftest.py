"""Shared fixtures. The same file runs at the repository root (against the finished package)
and inside every chapter's tree built by tools/steps.py (against that chapter's package)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, List

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.models import ensure_model  # noqa: E402

IN_CHAPTER_TREE = "MINISGL_BOOK_CHAPTER" in os.environ
# The tests are written for the CPU: they compare with transformers there. The mains follow
# the GPU when there is one (tools/parity.py).
os.environ["MINISGL_DEVICE"] = "cpu"
os.environ["MINISGL_BOOK_DEVICE"] = "cpu"


def _retired() -> dict:
    """At the repository root, tests that a chapter's manifest retires do not run."""
    if IN_CHAPTER_TREE or not (ROOT / "chapters" / "book.toml").exists():
        return {}
    from tools.steps import Book

    return Book(ROOT).retired_tests()


_RETIRED = _retired()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    try:
        rel = collection_path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return True if rel in _RETIRED else None


@pytest.fixture(scope="session")
def model_path() -> Callable[[str], Path]:
    """model_path("tiny-qwen3") -> the folder of that reference model (built on first use)."""
    return ensure_model


def tiny_model_names() -> List[str]:
    from tools.models import TINY_MODELS

    return list(TINY_MODELS)


@pytest.fixture(autouse=True)
def _fresh_global_state():
    """A test that fails half-way may leave an engine's global context behind; clear it, so
    that one failure does not cascade into the next tests."""
    yield
    try:
        from minisgl.core import clear_global_ctx
        from minisgl.distributed import reset_tp_info
    except ImportError:  # chapters before the package has them
        return
    clear_global_ctx()
    reset_tp_info()
