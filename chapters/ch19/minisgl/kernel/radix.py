"""The radix cache's key comparison in C++ (``csrc/src/radix.cpp``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from .utils import compiler_available, load_aot

if TYPE_CHECKING:
    from tvm_ffi import Module


@functools.cache
def _load_radix_module() -> Module:
    return load_aot("radix", cpp_files=["radix.cpp"])


def fast_compare_key(x: torch.Tensor, y: torch.Tensor) -> int:
    """How many leading ids two 1-D int CPU tensors share. The engine's ids are int32; ids of
    another integer type are converted (the C++ side compares buffers of one type)."""
    if not compiler_available():
        return compare_key_reference(x, y)
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return _load_radix_module().fast_compare_key(x, y)


def compare_key_reference(x: torch.Tensor, y: torch.Tensor) -> int:
    n = min(len(x), len(y))
    differ = (x[:n] != y[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n
