"""Greedy decoding's argmax as a block reduction (``csrc/jit/argmax.cu``).

Not in upstream, which calls `torch.argmax`: this kernel is the book's example of a kernel that
needs shared memory and `__syncthreads()`, the kind of bug the CPU simulator makes visible.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from .utils import KernelConfig, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi import Module

DEFAULT_ARGMAX_KERNEL_CONFIG = KernelConfig(num_threads=128)


@functools.cache
def _jit_argmax_module(
    *, cuda: bool, config: KernelConfig = DEFAULT_ARGMAX_KERNEL_CONFIG
) -> Module:
    args = make_cpp_args(*config)
    return load_jit(
        "argmax",
        *args,
        cuda_files=["argmax.cu"],
        cuda_wrappers=[("launch", f"ArgmaxKernel<{args}>::run")],
        cuda=cuda,
    )


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """`torch.argmax(logits, dim=-1)` for float32 logits [rows, vocabulary] (rows of unit
    stride); ties go to the smaller index like torch's. NaN is not handled."""
    output = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    _jit_argmax_module(cuda=logits.is_cuda).launch(logits, output)
    return output
