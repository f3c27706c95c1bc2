"""Helpers shared by the chapters' tests. Nothing here imports minisgl at module level."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import List, Sequence, Tuple

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


def step0_reference(folder: Path, prompts: Sequence[Sequence[int]], n: int) -> List[List[int]]:
    """Step 0's greedy tokens (chapter 00's engine, itself checked against transformers) for
    each prompt. Step 0 recomputes the whole sequence for every token, so the answer is kept
    for the rest of the process: several tests of a file ask for the same one."""
    frozen = tuple(tuple(p) for p in prompts)
    return [list(tokens) for tokens in _step0_tokens(str(folder), frozen, n)]


@functools.lru_cache(maxsize=None)
def _step0_tokens(
    folder: str, prompts: Tuple[Tuple[int, ...], ...], n: int
) -> Tuple[Tuple[int, ...], ...]:
    model = load_example("examples/ch00_step0.py").Step0Model(Path(folder))
    return tuple(tuple(model.generate(list(p), n)) for p in prompts)


__all__ = ["TREE_ROOT", "left_out", "load_example", "requires_model", "step0_reference"]
