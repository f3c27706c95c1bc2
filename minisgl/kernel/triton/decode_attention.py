"""Decode attention over ragged lengths, in pieces of nearly equal size (project P1).

At decode every request brings one query row per head and reads all its keys and values.
FlashInfer's decode kernel gives each (request, key/value head) one thread block, and splits a
request's keys only while the blocks fit in one wave on the GPU. With 256 requests of 100 to
2,000 keys that wave is ragged: the blocks of the long requests run on after the short ones
have left their SMs idle, and the kernel reads 3.1 to 3.6 TB/s where equal lengths reach 4.

Here a request's keys are cut into pieces of at least CHUNK keys, at most SPLITS of them (a
longer request gets longer pieces), and each (request, key/value head, piece) is one program:
the GPU's scheduler fills the SMs with many short programs instead of a few long ones. A
program keeps the running maximum of the scores, the running sum of their exponentials and the
weighted sum of the values (the online softmax), and writes its result, in float32
(narrow_parts: in the output's dtype, as FlashInfer's split kernels keep theirs; slower on the
H100), with its log-sum-exp. The pieces of a request are then merged, each weighed by exp(its
lse - the largest), which is what one softmax over the whole row gives: by a second kernel, or
(merge_here) by the piece that finishes last, which an atomic counter per (request, head)
tells. A request of one piece has nothing to merge: its program writes the output itself.
The grid is (requests, key/value heads, SPLITS), or (heads_first) (key/value heads, requests,
SPLITS), whatever the lengths, so a CUDA graph can replay it; programs past a request's last
piece return at once. On a CPU it runs under ``TRITON_INTERPRET=1`` (the tests).
"""

from __future__ import annotations

import math
import os
from typing import Dict

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _piece(
    length, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, EQUAL: tl.constexpr
):
    """The keys each program of a request takes: CHUNK, or more when the request's keys would
    need more than SPLITS programs, rounded up to whole loads of BLOCK_N. EQUAL: as many
    pieces as that, but of equal size (the last one no longer a remainder)."""
    size = tl.maximum(tl.cdiv(length, SPLITS), CHUNK)
    if EQUAL:
        size = tl.cdiv(length, tl.cdiv(length, size))
    return tl.cdiv(size, BLOCK_N) * BLOCK_N


@triton.jit
def _attend(
    q, k_ptr, v_ptr, slots, first_slot, key_mask, kv_head, k_stride_t, k_stride_h, v_stride_t,
    v_stride_h, scale_log2, best, total, acc, tile_column, HEAD_DIM: tl.constexpr,
    UPCAST: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """One load of keys and values at `slots` added to the online softmax (`best`, `total`,
    `acc`) of the query heads `q`. TMA: the tile of the descriptors at row `first_slot`,
    column `tile_column`."""
    dims = tl.arange(0, HEAD_DIM)
    if TMA:  # a whole tile: the keys past the piece's end are read too, and masked below
        k = k_ptr.load([first_slot, tile_column])
    else:
        k = tl.load(
            k_ptr + slots[:, None] * k_stride_t + kv_head * k_stride_h + dims[None, :],
            mask=key_mask[:, None],
            other=0.0,
        )
    if UPCAST:
        k = k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2
    scores = tl.where(key_mask[None, :], scores, float("-inf"))
    new_best = tl.maximum(best, tl.max(scores, 1))
    shrink = tl.exp2(best - new_best)
    weights = tl.exp2(scores - new_best[:, None])
    total = total * shrink + tl.sum(weights, 1)
    if TMA:  # slots past the end may hold anything, NaN too: 0 x NaN would spread
        v = tl.where(key_mask[:, None], v_ptr.load([first_slot, tile_column]), 0.0)
    else:
        v = tl.load(
            v_ptr + slots[:, None] * v_stride_t + kv_head * v_stride_h + dims[None, :],
            mask=key_mask[:, None],
            other=0.0,
        )
    if UPCAST:
        v = v.to(tl.float32)
    acc = acc * shrink[:, None] + tl.dot(weights.to(v.dtype), v, input_precision="ieee")
    return new_best, total, acc


@triton.jit
def _attend_loads(
    q, k_ptr, v_ptr, indices_ptr, start, stop, kv_head, kv_heads, k_stride_t, k_stride_h,
    v_stride_t, v_stride_h, scale_log2, best, total, acc, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, PAGE_RUNS: tl.constexpr,
    HND_PAGE: tl.constexpr,
):  # fmt: skip
    """The keys start..stop, BLOCK_N at a time, each load's slots read from `indices`: all
    of them, or (PAGE_RUNS) the first, which the others follow. HND_PAGE: the cache is
    [pages, kv_heads, HND_PAGE, head_dim], so the run's rows follow its first one in the
    page's block of this head (k_stride_t is then a token's stride inside that block)."""
    for offset in range(start, stop, BLOCK_N):
        keys = offset + tl.arange(0, BLOCK_N)
        key_mask = keys < stop
        if PAGE_RUNS:  # one index, not BLOCK_N: the load no longer waits on a gather
            first_slot = tl.load(indices_ptr + offset)
            first_row = first_slot.to(tl.int64)
            tile_column = kv_head * HEAD_DIM
            if HND_PAGE:  # rows of head_dim values: the page's block, then the run in it
                first_row = (first_row // HND_PAGE) * (kv_heads * HND_PAGE) + first_row % HND_PAGE
                first_slot = (first_row + kv_head * HND_PAGE).to(tl.int32)  # the tile's row
                tile_column = 0
            slots = first_row + tl.arange(0, BLOCK_N)
        else:
            first_slot, tile_column = offset, 0  # read only by TMA, which needs PAGE_RUNS
            slots = tl.load(indices_ptr + keys, mask=key_mask, other=0).to(tl.int64)
        best, total, acc = _attend(
            q, k_ptr, v_ptr, slots, first_slot, key_mask, kv_head, k_stride_t, k_stride_h,
            v_stride_t, v_stride_h, scale_log2, best, total, acc, tile_column, HEAD_DIM, UPCAST,
            TMA,
        )  # fmt: skip
    return best, total, acc


@triton.jit
def _attend_pages(
    q, k_ptr, v_ptr, indices_ptr, start, stop, kv_head, k_stride_t, k_stride_h, v_stride_t,
    v_stride_h, scale_log2, best, total, acc, first, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """The keys start..stop a page at a time (pages of the request starting at `first`):
    within a page they lie in consecutive slots, so the page's index is read once, before a
    loop over its loads that reads none. With nothing but keys and values to load in that
    loop, Triton's pipeliner can copy the next loads while this one is used."""
    for page_start in range(start - (start - first) % PAGE_SIZE, stop, PAGE_SIZE):
        run_start = tl.maximum(page_start, start)
        run_stop = tl.minimum(page_start + PAGE_SIZE, stop)
        run_slot = tl.load(indices_ptr + run_start).to(tl.int64) - run_start  # key j's slot - j
        for offset in range(run_start, run_stop, BLOCK_N):
            keys = offset + tl.arange(0, BLOCK_N)
            best, total, acc = _attend(
                q, k_ptr, v_ptr, run_slot + keys, (run_slot + offset).to(tl.int32),
                keys < run_stop, kv_head, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                scale_log2, best, total, acc, kv_head * HEAD_DIM, HEAD_DIM, UPCAST, TMA,
            )  # fmt: skip
    return best, total, acc


@triton.jit
def _decode_piece_kernel(
    q_ptr,
    k_ptr,  # [slots, kv_heads, head_dim]; with TMA, a descriptor of [slots, kv_heads * head_dim]
    v_ptr,  # the same for the values
    indptr_ptr,  # [batch + 1]: request r's keys are indices[indptr[r]:indptr[r + 1]]
    indices_ptr,  # the key/value slot of each key
    part_o_ptr,  # [batch, q_heads, SPLITS, head_dim], float32 or the output's dtype
    part_lse_ptr,  # [batch, q_heads, SPLITS] float32: its log-sum-exp, base 2
    out_ptr,  # [batch, q_heads, head_dim]: written here when MERGE_HERE
    counter_ptr,  # [batch * kv_heads] int32, zeros: pieces finished (MERGE_HERE)
    scale_log2,  # softmax scale x log2(e): the kernel uses exp2
    q_stride_r,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    v_stride_t,
    v_stride_h,
    out_stride_r,
    out_stride_h,
    GROUP: tl.constexpr,  # query heads per key/value head
    BLOCK_H: tl.constexpr,  # GROUP padded to 16, the smallest tl.dot
    HEAD_DIM: tl.constexpr,
    CHUNK: tl.constexpr,  # the fewest keys a program takes (unless the request has fewer)
    BLOCK_N: tl.constexpr,  # keys loaded at a time
    SPLITS: tl.constexpr,  # programs per (request, key/value head)
    EQUAL: tl.constexpr,  # pieces of equal size (see _piece)
    UPCAST: tl.constexpr,  # products in float32: Triton's CPU interpreter gets bfloat16 wrong
    MERGE_HERE: tl.constexpr,  # the request's last piece to finish merges (no second kernel)
    PAGE_RUNS: tl.constexpr,  # every BLOCK_N keys lie in BLOCK_N consecutive slots
    TMA: tl.constexpr,  # (with PAGE_RUNS) the keys and values by the GPU's bulk copies
    PAGE_LOOP: tl.constexpr,  # (with PAGE_RUNS) a loop over pages, one index read per page
    PAGE_SIZE: tl.constexpr,  # slots per page (PAGE_LOOP)
    HEADS_FIRST: tl.constexpr,  # the grid is (kv_heads, requests, SPLITS), not (requests, ...)
    HND_PAGE: tl.constexpr,  # (with PAGE_RUNS) the caches are [pages, kv_heads, HND_PAGE, dim]
    PDL: tl.constexpr,  # launched before the kernel before it ends: wait for its results
):
    if PDL:
        tl.extra.cuda.gdc_wait()
    if HEADS_FIRST:  # the programs launched one after another read one token's heads in turn
        request, kv_head, kv_heads = tl.program_id(1), tl.program_id(0), tl.num_programs(0)
    else:
        request, kv_head, kv_heads = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    split = tl.program_id(2)
    first = tl.load(indptr_ptr + request)
    end = tl.load(indptr_ptr + request + 1)
    size = _piece(end - first, CHUNK, BLOCK_N, SPLITS, EQUAL)
    start = first + split * size
    if start < end:
        stop = tl.minimum(start + size, end)
        group = tl.arange(0, BLOCK_H)
        dims = tl.arange(0, HEAD_DIM)
        head_mask = group < GROUP
        heads = kv_head * GROUP + group
        q = tl.load(
            q_ptr + request * q_stride_r + heads[:, None] * q_stride_h + dims[None, :],
            mask=head_mask[:, None],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        best = tl.full([BLOCK_H], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
        if PAGE_LOOP:
            best, total, acc = _attend_pages(
                q, k_ptr, v_ptr, indices_ptr, start, stop, kv_head, k_stride_t, k_stride_h,
                v_stride_t, v_stride_h, scale_log2, best, total, acc, first, PAGE_SIZE,
                BLOCK_N, HEAD_DIM, UPCAST, TMA,
            )  # fmt: skip
        else:
            best, total, acc = _attend_loads(
                q, k_ptr, v_ptr, indices_ptr, start, stop, kv_head, kv_heads, k_stride_t,
                k_stride_h, v_stride_t, v_stride_h, scale_log2, best, total, acc, BLOCK_N,
                HEAD_DIM, UPCAST, TMA, PAGE_RUNS, HND_PAGE,
            )  # fmt: skip
        if PDL:  # the merge may start now: its programs wait for this kernel's end
            tl.extra.cuda.gdc_launch_dependents()
        pieces = tl.cdiv(end - first, size)
        row = (request * (GROUP * kv_heads) + heads) * SPLITS + split
        out = out_ptr + request * out_stride_r + heads[:, None] * out_stride_h + dims[None, :]
        if pieces == 1:  # the whole request: nothing to merge
            tl.store(
                out, (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None]
            )
        else:
            tl.store(
                part_o_ptr + row[:, None] * HEAD_DIM + dims[None, :],
                (acc / total[:, None]).to(part_o_ptr.dtype.element_ty),
                mask=head_mask[:, None],
            )
            tl.store(part_lse_ptr + row, best + tl.log2(total), mask=head_mask)
            if MERGE_HERE:
                # every thread's stores before the count; the last piece counted merges all
                tl.debug_barrier()
                counter = counter_ptr + request * kv_heads + kv_head
                finished = tl.atomic_add(counter, 1, sem="acq_rel")
                if finished == pieces - 1:
                    tl.atomic_xchg(counter, 0)  # zero again for the next call
                    _merge_pieces(
                        part_o_ptr, part_lse_ptr, row - split, pieces, out, head_mask,
                        BLOCK_H, HEAD_DIM,
                    )  # fmt: skip


@triton.jit
def _merge_pieces(
    part_o_ptr, part_lse_ptr, rows, pieces, out, head_mask, BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Merge the pieces' partial results of the heads at `rows` (their first piece) into
    `out`: each piece weighed by exp2(its lse - the largest), as one softmax would have."""
    dims = tl.arange(0, HEAD_DIM)
    best = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for piece in range(0, pieces):
        # .cg: from L2, where the other programs' stores are, never a stale line of L1
        lse = tl.load(part_lse_ptr + rows + piece, mask=head_mask, other=0.0, cache_modifier=".cg")
        o = tl.load(
            part_o_ptr + (rows + piece)[:, None] * HEAD_DIM + dims[None, :],
            mask=head_mask[:, None], other=0.0, cache_modifier=".cg",
        ).to(tl.float32)  # fmt: skip
        new_best = tl.maximum(best, lse)
        shrink = tl.exp2(best - new_best)
        weight = tl.exp2(lse - new_best)
        total = total * shrink + weight
        acc = acc * shrink[:, None] + o * weight[:, None]
        best = new_best
    tl.store(out, (acc / total[:, None]).to(out.dtype.element_ty), mask=head_mask[:, None])


@triton.jit
def _decode_merge_kernel(
    part_o_ptr,
    part_lse_ptr,
    indptr_ptr,
    out_ptr,
    out_stride_r,
    out_stride_h,
    HEAD_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    EQUAL: tl.constexpr,
    BLOCK_S: tl.constexpr,  # SPLITS rounded up to a power of two
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()
    request = tl.program_id(0)
    head = tl.program_id(1)
    length = tl.load(indptr_ptr + request + 1) - tl.load(indptr_ptr + request)
    pieces = tl.cdiv(length, _piece(length, CHUNK, BLOCK_N, SPLITS, EQUAL))
    if pieces != 1:  # one piece has written the output itself
        chunks = tl.arange(0, BLOCK_S)
        chunk_mask = chunks < pieces
        row = (request * tl.num_programs(1) + head) * SPLITS + chunks
        lse = tl.load(part_lse_ptr + row, mask=chunk_mask, other=float("-inf"))
        best = tl.maximum(tl.max(lse, 0), -1e30)  # a request without keys gets zeros, not NaN
        weights = tl.exp2(lse - best)
        weights = weights / tl.maximum(tl.sum(weights, 0), 1e-30)
        dims = tl.arange(0, HEAD_DIM)
        o = tl.load(
            part_o_ptr + row[:, None] * HEAD_DIM + dims[None, :],
            mask=chunk_mask[:, None],
            other=0.0,
        ).to(tl.float32)
        merged = tl.sum(o * weights[:, None], 0)
        out = out_ptr + request * out_stride_r + head * out_stride_h + dims
        tl.store(out, merged.to(out_ptr.dtype.element_ty))


_COUNTERS: Dict[torch.device, torch.Tensor] = {}


def _zeroed_counters(device: torch.device, n: int) -> torch.Tensor:
    """n counters at zero, from one buffer per device that is never freed (a CUDA graph
    keeps its address) and that the kernel leaves at zero after each call."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(1 << 20, dtype=torch.int32, device=device)
    assert n <= _COUNTERS[device].numel(), n
    return _COUNTERS[device]


def _tile_source(cache: torch.Tensor, block_n: int) -> TensorDescriptor:
    """The cache as rows, read in tiles of block_n rows by one head's head_dim: [slots,
    kv_heads, head_dim] as rows of slots (NHD), [pages, kv_heads, page, head_dim] as rows of
    one head's token (HND)."""
    head_dim = cache.shape[-1]
    rows = cache.view(cache.shape[0], -1) if cache.dim() == 3 else cache.view(-1, head_dim)
    return TensorDescriptor.from_tensor(rows, [block_n, head_dim])


def piece_constants(
    group: int,
    head_dim: int,
    *,
    splits: int,
    chunk: int,
    block_n: int,
    equal: bool,
    merge_here: bool,
    page_size: int,
    tma: bool,
    page_loop: bool,
    heads_first: bool = False,
    kv_layout: str = "NHD",
    pdl: bool = False,
) -> Dict[str, object]:
    """The compile-time arguments of `_decode_piece_kernel` for these settings (what
    decode_attention_triton launches it with, and tools/compiled_kernel.py compiles)."""
    page_runs = page_size % block_n == 0
    return dict(
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        CHUNK=chunk,
        BLOCK_N=block_n,
        SPLITS=splits,
        EQUAL=equal,
        UPCAST=os.environ.get("TRITON_INTERPRET") == "1",
        MERGE_HERE=merge_here,
        PAGE_RUNS=page_runs,
        TMA=tma,
        PAGE_LOOP=page_loop and page_runs,
        PAGE_SIZE=page_size if page_loop and page_runs else 1,
        HEADS_FIRST=heads_first,
        HND_PAGE=page_size if kv_layout == "HND" else 0,
        PDL=pdl,
    )


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    splits: int = 8,
    chunk: int = 256,
    sm_scale: float | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    merge_here: bool = False,
    equal: bool = False,
    page_size: int = 1,
    tma: bool = False,
    narrow_parts: bool = False,
    page_loop: bool = False,
    heads_first: bool = False,
    kv_layout: str = "NHD",
    max_registers: int = 0,
    merge_warps: int = 4,
    pdl: bool = False,
) -> torch.Tensor:
    """One decode step's attention: q [batch, q_heads, head_dim], the caches [slots, kv_heads,
    head_dim], request r's keys at slots indices[indptr[r]:indptr[r + 1]]. Each request's keys
    go to at most `splits` programs per key/value head, each taking `chunk` keys or more
    (`equal`: as many pieces, of equal size). `merge_here`: the last piece merges, no second
    kernel. `page_size`: each request's keys fill whole pages of that many consecutive slots,
    first to last; where `block_n` divides it, each load of keys takes one index, and `tma`
    loads the keys and values by the GPU's bulk copies (Hopper's TMA) instead of the threads.
    The pieces' results are kept in float32 for the merge, or in q's dtype (`narrow_parts`).
    `page_loop` (where each load takes one index): a loop over the piece's pages, whose index is
    read once per page, around a loop over its loads that reads no index, so that Triton's
    pipeliner may keep more than one load of keys in flight. `heads_first`: the grid's first
    axis is the key/value head, so that the programs the GPU starts side by side read the heads
    of the same requests, neighbours in the cache's rows, rather than one head of many requests.
    `kv_layout` "HND": the caches are [pages, kv_heads, page_size, head_dim] (FlashInfer's name
    for it), so that the keys of one head in a page are one block of memory; slot s is token
    s % page_size of page s // page_size. `max_registers` (0: as many as the compiler takes)
    caps the registers of a thread of the pieces' kernel, so that more programs fit on an SM;
    the compiler spills what does not fit to local memory. `merge_warps`: the warps of a
    program of the second kernel, which merges one head's pieces. `pdl` (a GPU's programmatic
    dependent launch): each kernel may be started before the kernel before it has finished,
    and waits for its results before it reads anything. Returns [batch, q_heads, head_dim] in
    q's dtype."""
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    assert group * kv_heads == q_heads and head_dim == triton.next_power_of_2(head_dim)
    assert k_cache.stride(-1) == v_cache.stride(-1) == q.stride(2) == 1
    assert chunk % block_n == 0, (chunk, block_n)
    scale = sm_scale if sm_scale is not None else head_dim**-0.5
    page_runs = page_size % block_n == 0
    assert page_runs or not tma, "TMA reads runs of consecutive slots: pages of block_n or more"
    assert kv_layout in ("NHD", "HND"), kv_layout
    if kv_layout == "HND":  # a token's row is found from its page's: whole blocks, runs only
        assert page_runs and not page_loop, "HND: one index per load, not per page"
        for cache in (k_cache, v_cache):
            assert cache.shape[1:] == (kv_heads, page_size, head_dim) and cache.is_contiguous()
    token_axis = 0 if kv_layout == "NHD" else 2  # between slots, or within a page's block
    part_dtype = q.dtype if narrow_parts else torch.float32
    part_o = q.new_empty((batch, q_heads, splits, head_dim), dtype=part_dtype)
    part_lse = q.new_empty((batch, q_heads, splits), dtype=torch.float32)
    out = torch.empty_like(q)
    if batch == 0:
        return out
    counters = _zeroed_counters(q.device, batch * kv_heads)
    keys, values = (_tile_source(c, block_n) if tma else c for c in (k_cache, v_cache))
    grid = (kv_heads, batch, splits) if heads_first else (batch, kv_heads, splits)
    _decode_piece_kernel[grid](
        q,
        keys,
        values,
        indptr,
        indices,
        part_o,
        part_lse,
        out,
        counters,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        k_cache.stride(token_axis),
        k_cache.stride(1),
        v_cache.stride(token_axis),
        v_cache.stride(1),
        out.stride(0),
        out.stride(1),
        **piece_constants(
            group,
            head_dim,
            splits=splits,
            chunk=chunk,
            block_n=block_n,
            equal=equal,
            merge_here=merge_here,
            page_size=page_size,
            tma=tma,
            page_loop=page_loop,
            heads_first=heads_first,
            kv_layout=kv_layout,
            pdl=pdl,
        ),  # fmt: skip
        num_warps=num_warps,
        num_stages=num_stages,
        **({"maxnreg": max_registers} if max_registers else {}),
        **({"launch_pdl": True} if pdl else {}),
    )
    if merge_here:
        return out
    _decode_merge_kernel[(batch, q_heads)](
        part_o,
        part_lse,
        indptr,
        out,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        CHUNK=chunk,
        BLOCK_N=block_n,
        SPLITS=splits,
        EQUAL=equal,
        BLOCK_S=triton.next_power_of_2(splits),
        PDL=pdl,
        num_warps=merge_warps,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out
