"""The KV store of ``csrc/jit/store.cu`` written in Triton, to compare the two ways of
writing a kernel: CUDA says what each thread does, Triton what each program (a block of
threads) does with whole vectors, and its compiler spreads the vector over the threads.

Program t copies token t's key row and value row into row indices[t] of the caches. On a GPU
Triton compiles it; on a CPU it runs with ``TRITON_INTERPRET=1`` (set before triton is imported),
which executes the program with numpy, one program after another.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_cache_ptr,
    v_cache_ptr,
    indices_ptr,
    k_ptr,
    v_ptr,
    cache_stride,  # elements from one cache row to the next
    input_stride,  # elements from one token's k (or v) to the next
    row_size,  # elements in a row
    BLOCK: tl.constexpr,  # a power of two >= row_size
):
    token = tl.program_id(0)
    slot = tl.load(indices_ptr + token).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    in_row = columns < row_size
    src = token.to(tl.int64) * input_stride + columns
    dst = slot * cache_stride + columns
    tl.store(k_cache_ptr + dst, tl.load(k_ptr + src, mask=in_row), mask=in_row)
    tl.store(v_cache_ptr + dst, tl.load(v_ptr + src, mask=in_row), mask=in_row)


def store_cache_triton(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """The arguments of `minisgl.kernel.store_cache`."""
    num_slots = k_cache.shape[0]
    k_cache, v_cache = k_cache.view(num_slots, -1), v_cache.view(num_slots, -1)
    k, v = k.view(k.shape[0], -1), v.view(v.shape[0], -1)
    row_size = k_cache.shape[1]
    assert k.shape == v.shape == (len(indices), row_size) and k.stride() == v.stride()
    assert k_cache.stride() == v_cache.stride() and k.stride(1) == k_cache.stride(1) == 1
    assert k.dtype == k_cache.dtype == v.dtype == v_cache.dtype
    if len(indices) == 0:
        return
    _store_kv_kernel[(len(indices),)](
        k_cache,
        v_cache,
        indices,
        k,
        v,
        k_cache.stride(0),
        k.stride(0),
        row_size,
        BLOCK=triton.next_power_of_2(row_size),
    )
