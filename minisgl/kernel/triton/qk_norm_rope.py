"""Qwen3's per-head q and k norms and RoPE, in one kernel (project P1).

On a GPU the attention layer normalises q (one FlashInfer launch), then k (another), then
rotates both (a third). Each is a few microseconds over a few hundred kilobytes at decode, so
the launches cost more than the arithmetic: 28 layers x 3 launches per decode step. This
kernel does the three in one launch, reading q and k once and writing them once, in place.

Program t takes token t: its q heads as one [heads, head_dim / 2] block per half of the head
dimension, then its k heads the same way. For each head: the mean of the squares over the
whole head, the norm's weight, then the rotation of each pair (x[i], x[i + d/2]) by the angle
of the token's position, read from the engine's table [cos | sin] (layers/rotary.py). The sums
and the rotation are in float32 and the result is rounded once; FlashInfer's two kernels round
between the norm and the rotation. On a CPU it runs under ``TRITON_INTERPRET=1`` (the tests).

Given the KV pool's rows of this layer (`KVStore`), the program also stores the token's key
(normalised and rotated) and its value in the pool's row of the token's slot, where the
attention backend would store them with a launch of its own: one launch fewer per layer. The
key is then written to the pool only, not back into the qkv output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_rope_heads(
    row_ptr,  # the token's heads
    out_row_ptr,  # where the result goes: the same row, or the token's slot's row in the pool
    weight_ptr,
    cos_sin_row_ptr,
    eps,
    NUM_HEADS: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,  # a power of two >= NUM_HEADS
    HALF: tl.constexpr,  # head_dim / 2, a power of two
):
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    columns = tl.arange(0, HALF)[None, :]
    mask = heads < NUM_HEADS
    first_ptr = row_ptr + heads * (2 * HALF) + columns
    first = tl.load(first_ptr, mask=mask).to(tl.float32)
    second = tl.load(first_ptr + HALF, mask=mask).to(tl.float32)
    mean_square = (tl.sum(first * first, axis=1) + tl.sum(second * second, axis=1)) / (2 * HALF)
    scale = (1.0 / tl.sqrt(mean_square + eps))[:, None]
    first = first * scale * tl.load(weight_ptr + columns).to(tl.float32)
    second = second * scale * tl.load(weight_ptr + HALF + columns).to(tl.float32)
    cos = tl.load(cos_sin_row_ptr + columns)
    sin = tl.load(cos_sin_row_ptr + HALF + columns)
    out_first_ptr = out_row_ptr + heads * (2 * HALF) + columns
    out_dtype = out_row_ptr.dtype.element_ty
    tl.store(out_first_ptr, (first * cos - second * sin).to(out_dtype), mask=mask)
    tl.store(out_first_ptr + HALF, (second * cos + first * sin).to(out_dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    q_stride,  # elements from one token's q to the next (the qkv row)
    k_stride,
    q_weight_ptr,
    k_weight_ptr,
    positions_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    eps,
    v_ptr,  # the store's arguments: read only when STORE
    k_pool_ptr,
    v_pool_ptr,
    pool_stride,  # elements from one slot's row of the pool to the next
    slots_ptr,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HALF: tl.constexpr,
    STORE: tl.constexpr,
    PDL: tl.constexpr,  # launched before the kernel before it ends: wait for its results
):
    if PDL:
        tl.extra.cuda.gdc_wait()
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token).to(tl.int64)
    row = cos_sin_ptr + position * cos_sin_stride
    q_row_ptr = q_ptr + token.to(tl.int64) * q_stride
    _norm_rope_heads(q_row_ptr, q_row_ptr, q_weight_ptr, row, eps, NUM_Q_HEADS, BLOCK_Q, HALF)
    k_row_ptr = k_ptr + token.to(tl.int64) * k_stride
    if STORE:
        slot = tl.load(slots_ptr + token).to(tl.int64)
        k_out_ptr = k_pool_ptr + slot * pool_stride
        # the value as it is, one flat row of NUM_K_HEADS * 2 * HALF elements (v's rows are
        # as far apart as k's)
        columns = tl.arange(0, BLOCK_K * 2 * HALF)
        in_row = columns < NUM_K_HEADS * 2 * HALF
        value = tl.load(v_ptr + token.to(tl.int64) * k_stride + columns, mask=in_row)
        tl.store(v_pool_ptr + slot * pool_stride + columns, value, mask=in_row)
    else:
        k_out_ptr = k_row_ptr
    _norm_rope_heads(k_row_ptr, k_out_ptr, k_weight_ptr, row, eps, NUM_K_HEADS, BLOCK_K, HALF)
    if PDL:  # the attention's kernel may start: it waits for this one's end
        tl.extra.cuda.gdc_launch_dependents()


@dataclass(frozen=True)
class KVStore:
    """Where the kernel stores each token's key and value: row slots[t] of k_pool and v_pool
    (one layer of the KV pool, [slots, kv_heads * head_dim]); v [n, kv_heads * head_dim] is
    the values, a view of the qkv output like k."""

    k_pool: torch.Tensor
    v_pool: torch.Tensor
    slots: torch.Tensor
    v: torch.Tensor


def qk_norm_rope_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    store: KVStore | None = None,
    pdl: bool = False,
) -> None:
    """Normalise each head of q [n, q_heads * head_dim] and k [n, k_heads * head_dim] (views
    of the qkv output: rows may be further apart than their width) with its weight, then
    rotate it by its token's position, in place; given `store`, the keys go to the pool
    instead, and the values with them. `pdl`: launched by the GPU's programmatic dependent
    launch (see decode_attention_triton)."""
    n = q.shape[0]
    half = head_dim // 2
    assert half * 2 == head_dim and half == triton.next_power_of_2(half), head_dim
    assert q.stride(1) == k.stride(1) == 1 and k.shape[0] == n == positions.shape[0]
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.shape[1] == head_dim
    if store is not None:
        pool_shape = (store.k_pool.shape[0], k.shape[1])
        assert store.k_pool.shape == store.v_pool.shape == pool_shape, (store.k_pool.shape, k.shape)
        assert store.k_pool.stride() == store.v_pool.stride() and store.k_pool.stride(1) == 1
        assert store.v.shape == k.shape and store.v.stride() == k.stride()
        assert store.k_pool.dtype == store.v_pool.dtype == k.dtype == store.v.dtype
        assert store.slots.shape == (n,)
    if n == 0:
        return
    q_heads, k_heads = q.shape[1] // head_dim, k.shape[1] // head_dim
    v, k_pool, v_pool, slots = (k, k, k, positions) if store is None else (
        store.v, store.k_pool, store.v_pool, store.slots)  # fmt: skip
    _qk_norm_rope_kernel[(n,)](
        q,
        k,
        q.stride(0),
        k.stride(0),
        q_weight,
        k_weight,
        positions,
        cos_sin_cache,
        cos_sin_cache.stride(0),
        eps,
        v,
        k_pool,
        v_pool,
        k_pool.stride(0),
        slots,
        NUM_Q_HEADS=q_heads,
        NUM_K_HEADS=k_heads,
        BLOCK_Q=triton.next_power_of_2(q_heads),
        BLOCK_K=triton.next_power_of_2(k_heads),
        HALF=half,
        STORE=store is not None,
        PDL=pdl,
        **({"launch_pdl": True} if pdl else {}),
    )
