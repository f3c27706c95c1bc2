"""Helpers shared by the chapters' tests. Nothing here imports minisgl at module level."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.models import PARITY_MODELS
from tools.parity import load_example

TREE_ROOT = Path(__file__).resolve().parents[2]


def left_out(name: str) -> bool:
    """Whether $MINISGL_BOOK_MODELS leaves this reference model out (on a machine that cannot
    download SmolLM2, say). The tiny models can always be built."""
    return name not in PARITY_MODELS and not name.startswith("tiny-")


def requires_model(name: str) -> pytest.MarkDecorator:
    """Skip a test that needs `name` where the book's settings leave it out, as the mains do."""
    reason = f"{name} is left out by MINISGL_BOOK_MODELS={os.environ.get('MINISGL_BOOK_MODELS')}"
    return pytest.mark.skipif(left_out(name), reason=reason)


__all__ = ["TREE_ROOT", "left_out", "load_example", "requires_model"]
