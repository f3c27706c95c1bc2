"""A stand-in for `sgl_kernel.flash_attn.flash_attn_with_kvcache`, FlashAttention 3 over a
paged KV cache, as upstream calls it: the new keys are already in the cache, so the call only
reads it.

Its conventions, which the stand-in checks: q is ragged, request b's queries being rows
cu_seqlens_q[b]:cu_seqlens_q[b + 1]; request b has cache_seqlens[b] keys, in the pages
page_table[b, 0], page_table[b, 1], ... of k_cache [pages, page_size, kv_heads, d]; the causal
mask is aligned to the bottom right (the queries are the last positions).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from examples.helpers.gpu_libraries import attend, check_kernel_dtype


def _int32(tensor: Optional[torch.Tensor], name: str, dims: int) -> torch.Tensor:
    if tensor is None:
        raise ValueError(f"{name} is required by the paged, ragged call")
    if tensor.dtype != torch.int32 or tensor.dim() != dims:
        raise ValueError(
            f"{name} must be a {dims}-D int32 tensor, got {tensor.dtype} {tuple(tensor.shape)}"
        )
    return tensor


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    ver: int = 3,
) -> torch.Tensor:
    out = torch.empty_like(q)  # allocated where chapter 18's graph emulation sees it
    with torch._C.DisableTorchFunction():  # a kernel: opaque to that emulation
        return _attention(
            q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q,
            max_seqlen_q, softmax_scale, causal, window_size, softcap, return_softmax_lse, ver,
            out,
        )  # fmt: skip


def _attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor],
    v: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    page_table: Optional[torch.Tensor],
    cu_seqlens_q: Optional[torch.Tensor],
    max_seqlen_q: Optional[int],
    softmax_scale: Optional[float],
    causal: bool,
    window_size: Tuple[int, int],
    softcap: float,
    return_softmax_lse: bool,
    ver: int,
    out: torch.Tensor,
) -> torch.Tensor:
    if k is not None or v is not None:
        raise NotImplementedError("the stand-in reads the cache only: store k and v before")
    if not causal or window_size != (-1, -1) or softcap != 0.0 or return_softmax_lse:
        raise NotImplementedError("the stand-in models plain causal attention only")
    if ver not in (3, 4):
        raise ValueError(f"FlashAttention version {ver} is not built")
    check_kernel_dtype(q.dtype, q.device, "FlashAttention")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError("query and key/value must have the same dtype")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must have contiguous last dimension")
    lengths = _int32(cache_seqlens, "cache_seqlens", 1).tolist()
    offsets = _int32(cu_seqlens_q, "cu_seqlens_q", 1).tolist()
    table = _int32(page_table, "page_table", 2)
    batch, page_size = len(lengths), k_cache.shape[1]
    if len(offsets) != batch + 1 or table.shape[0] != batch:
        raise ValueError(f"{batch} requests in cache_seqlens, {len(offsets) - 1} in "
                         f"cu_seqlens_q, {table.shape[0]} rows in page_table")  # fmt: skip
    if q.dim() != 3 or q.shape[0] != offsets[-1]:
        raise ValueError(
            f"q must be [{offsets[-1]}, heads, d] (cu_seqlens_q[-1] rows), got {tuple(q.shape)}"
        )
    if q.shape[1] % k_cache.shape[2] or q.shape[2] != k_cache.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} does not fit the cache {tuple(k_cache.shape)}")
    longest = max((b - a for a, b in zip(offsets, offsets[1:])), default=0)
    if max_seqlen_q is None or max_seqlen_q < longest:
        raise ValueError(f"max_seqlen_q = {max_seqlen_q}, but a request has {longest} queries")
    if lengths and max(lengths) > table.shape[1] * page_size:
        raise ValueError("a request has more keys than its row of page_table can address")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    for b in range(batch):
        rows = slice(offsets[b], offsets[b + 1])
        if offsets[b + 1] - offsets[b] > lengths[b]:
            raise ValueError(f"request {b}: more queries than keys")
        pages = table[b, : -(-lengths[b] // page_size)].long()
        if pages.numel() and int(pages.max()) >= k_cache.shape[0]:
            raise IndexError(
                f"request {b}: a page index beyond the cache's {k_cache.shape[0]} pages"
            )
        keys = k_cache[pages].flatten(0, 1)[: lengths[b]]
        values = v_cache[pages].flatten(0, 1)[: lengths[b]]
        out[rows] = attend(q[rows], keys, values, scale)
    return out
