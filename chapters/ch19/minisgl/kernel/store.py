"""Writing a batch's new keys and values into the KV pool.

Token i of the batch goes to row indices[i] of the flat cache (one row per token slot, every
page laid end to end). `store_cache` launches one kernel (``csrc/jit/store.cu``) that copies both
the keys and the values, a warp per token: on a GPU compiled by nvcc, on a CPU run by the
simulator. `store_cache_reference` is the same operation in PyTorch, two indexed copies: the
tests hold the kernel to it, and the engine falls back to it where no compiler is installed.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from .utils import KernelConfig, chunk_bytes, compiler_available, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi import Module

DEFAULT_STORE_KERNEL_CONFIG = KernelConfig(num_threads=128)


@functools.cache
def _jit_store_module(
    row_bytes: int,
    unit: int,
    *,
    cuda: bool,
    config: KernelConfig = DEFAULT_STORE_KERNEL_CONFIG,
) -> Module:
    args = make_cpp_args(row_bytes, unit, *config)
    return load_jit(
        "store",
        *args,
        cuda_files=["store.cu"],
        cuda_wrappers=[("launch", f"StoreKernel<{args}>::run")],
        cuda=cuda,
    )


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """k_cache, v_cache: [num_slots, heads, head_dim]; k, v: [n, heads * head_dim] or
    [n, heads, head_dim], rows of any stride, converted to the caches' dtype; indices: [n]
    slot of each new token."""
    cuda = k_cache.is_cuda
    if not cuda and not compiler_available():
        return store_cache_reference(k_cache, v_cache, indices, k, v)
    num_slots = k_cache.shape[0]
    k_cache, v_cache = k_cache.view(num_slots, -1), v_cache.view(num_slots, -1)
    row = k_cache.shape[1]
    k, v = k.view(k.shape[0], row), v.view(v.shape[0], row)
    if k.dtype != k_cache.dtype:  # the kernel copies bytes: convert first (chapter 04's contract)
        k, v = k.to(k_cache.dtype), v.to(k_cache.dtype)
    item = k_cache.element_size()
    row_bytes = row * item
    unit = chunk_bytes(
        row_bytes,
        k_cache.stride(0) * item,
        k.stride(0) * item,
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
    )
    _jit_store_module(row_bytes, unit, cuda=cuda).launch(k_cache, v_cache, indices, k, v)


def store_cache_reference(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    num_slots = k_cache.shape[0]
    k_flat, v_flat = k_cache.view(num_slots, -1), v_cache.view(num_slots, -1)
    index = indices.long()
    k_flat.index_copy_(0, index, k.reshape(len(index), k_flat.shape[1]).to(k_flat.dtype))
    v_flat.index_copy_(0, index, v.reshape(len(index), v_flat.shape[1]).to(v_flat.dtype))
