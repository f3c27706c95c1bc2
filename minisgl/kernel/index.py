"""The embedding lookup as a kernel: `output[i] = weights[indices[i]]`.

With a vocabulary range `(start, length)` (a tensor-parallel rank's slice), a token outside it
gets a row of zeros. `indexing` launches ``csrc/jit/index.cu`` (nvcc on a GPU, the simulator on
a CPU); `indexing_reference` is the same in PyTorch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Tuple

import torch
import torch.nn.functional as F

from .utils import KernelConfig, chunk_bytes, load_jit, make_cpp_args, use_custom_kernels

if TYPE_CHECKING:
    from tvm_ffi import Module

DEFAULT_INDEX_KERNEL_CONFIG = KernelConfig(num_threads=128)


@functools.cache
def _jit_index_module(
    row_bytes: int,
    unit: int,
    *,
    num_splits: int,
    cuda: bool,
    config: KernelConfig = DEFAULT_INDEX_KERNEL_CONFIG,
) -> Module:
    args = make_cpp_args(row_bytes, num_splits, unit, *config)
    return load_jit(
        "index",
        *args,
        cuda_files=["index.cu"],
        cuda_wrappers=[("launch", f"IndexKernel<{args}>::run")],
        cuda=cuda,
    )


def indexing(
    weights: torch.Tensor,
    indices: torch.Tensor,
    *,
    output: torch.Tensor | None = None,
    vocab_range: Tuple[int, int] | None = None,  # (start, length)
) -> torch.Tensor:
    """Rows `indices` of `weights` [rows, width]: [len(indices), width]."""
    if output is None:
        output = weights.new_empty(indices.shape[0], weights.shape[1])
    cuda = weights.is_cuda
    if not use_custom_kernels(cuda):
        return indexing_reference(weights, indices, output=output, vocab_range=vocab_range)
    row_bytes = weights.shape[1] * weights.element_size()
    # a row of 2 KiB or more is split among warps: few tokens still occupy many warps
    num_splits = 4 if row_bytes % 2048 == 0 else 2 if row_bytes % 1024 == 0 else 1
    unit = chunk_bytes(row_bytes // num_splits, weights.data_ptr(), output.data_ptr())
    module = _jit_index_module(row_bytes, unit, num_splits=num_splits, cuda=cuda)
    module.launch(weights, indices, output, vocab_range)
    return output


def indexing_reference(
    weights: torch.Tensor,
    indices: torch.Tensor,
    *,
    output: torch.Tensor | None = None,
    vocab_range: Tuple[int, int] | None = None,
) -> torch.Tensor:
    if vocab_range is None:
        rows = F.embedding(indices, weights)
    else:
        start, length = vocab_range
        mine = (indices >= start) & (indices < start + length)
        rows = F.embedding(torch.where(mine, indices - start, 0), weights)
        rows.masked_fill_(~mine.unsqueeze(-1), 0.0)
    if output is None:
        return rows
    return output.copy_(rows)
