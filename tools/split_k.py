"""A split-K matrix product in Triton, timed by `python tools/bench_p1.py split-k` against
cuBLAS for the decode step's two products with few outputs (o and down), and by
`python tools/bench_p1.py split-k-norm` with the add-and-norm that follows each of them. Not
part of the engine: a candidate, measured.

`F.linear(x, weight)` for a few rows `x` [M, K] and a weight [N, K] with N = 1,024 outputs
gives cuBLAS few output tiles to share between the GPU's multiprocessors, and each tile's sum
runs over all K inputs. Here the K inputs are cut into `split` slices: program (n, s, m) sums
slice s for the outputs of tile n and the rows of tile m into a float32 buffer. A second
kernel adds the slices and rounds to the output's type; or, in `split_k_add_norm`, it goes on
with what the layer does next: adds the product to the residual stream and normalises the sum
(FlashInfer's `fused_add_rmsnorm`), so that the split costs no launch of its own."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _slice_products(
    x, weight, partial, M, N, K, K_SLICE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    tile, piece, row_tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    outputs = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(0, K_SLICE, BLOCK_K):
        inputs = piece * K_SLICE + start + tl.arange(0, BLOCK_K)
        a = tl.load(x + rows[:, None] * K + inputs[None, :], mask=rows[:, None] < M, other=0.0)
        b = tl.load(weight + outputs[:, None] * K + inputs[None, :])
        acc += tl.dot(a, tl.trans(b))
    at = partial + piece * M * N + rows[:, None] * N + outputs[None, :]
    tl.store(at, acc, mask=rows[:, None] < M)


@triton.jit
def _add_slices(partial, out, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < MN
    acc = tl.zeros((BLOCK,), tl.float32)
    for piece in range(SPLIT):
        acc += tl.load(partial + piece * MN + offsets, mask=inside, other=0.0)
    tl.store(out + offsets, acc.to(out.dtype.element_ty), mask=inside)


@triton.jit
def _add_slices_norm(
    partial, residual, out, norm_weight, M, eps,
    N: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    columns = tl.arange(0, BLOCK)
    inside = columns < N
    product = tl.zeros((BLOCK,), tl.float32)
    for piece in range(SPLIT):
        product += tl.load(partial + (piece * M + row) * N + columns, mask=inside, other=0.0)
    # the product as F.linear returns it (rounded to the stream's type), then FlashInfer's
    # order: the sum in float32, stored rounded, normalised unrounded
    dtype = residual.dtype.element_ty
    stream = product.to(dtype).to(tl.float32)
    stream += tl.load(residual + row * N + columns, mask=inside, other=0.0).to(tl.float32)
    tl.store(residual + row * N + columns, stream.to(dtype), mask=inside)
    scale = tl.math.rsqrt(tl.sum(stream * stream, axis=0) / N + eps)
    weight = tl.load(norm_weight + columns, mask=inside, other=0.0).to(tl.float32)
    tl.store(out + row * N + columns, (stream * scale * weight).to(dtype), mask=inside)


def _products(
    x: torch.Tensor, weight: torch.Tensor, split: int, block_n: int, block_k: int,
    block_m: int | None, partial: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """The slices' float32 sums, [split, M, N], checked against the tiles."""
    (m, k), n = x.shape, weight.shape[0]
    assert n % block_n == 0 and k % (split * block_k) == 0, (n, k, split, block_n, block_k)
    if block_m is None:
        block_m = max(16, triton.next_power_of_2(m))  # tl.dot takes tiles of 16 rows or more
    if partial is None:
        partial = torch.empty(split, m, n, device=x.device, dtype=torch.float32)
    grid = (n // block_n, split, triton.cdiv(m, block_m))
    _slice_products[grid](x, weight, partial, m, n, k, k // split, block_m, block_n, block_k)
    return partial


def split_k_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    split: int,
    block_n: int,
    block_k: int,
    partial: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight)` with the sum over K cut into `split` slices. N must be a multiple
    of `block_n` and K of `split * block_k`; rows go in tiles of `block_m` (all in one tile if
    None); `partial` ([split, M, N] float32) and `out` may be given, to replay the call in a
    CUDA graph."""
    partial = _products(x, weight, split, block_n, block_k, block_m, partial)
    if out is None:
        out = torch.empty(x.shape[0], weight.shape[0], device=x.device, dtype=x.dtype)
    _add_slices[(triton.cdiv(out.numel(), 1024),)](partial, out, out.numel(), split, 1024)
    return out


def split_k_add_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    split: int,
    block_n: int,
    block_k: int,
    block_m: int | None = None,
    partial: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """What `y = F.linear(x, weight)` and then FlashInfer's `fused_add_rmsnorm(y, residual,
    norm_weight, eps)` compute, in two launches: `residual` becomes residual + y (in place),
    and the normalised sum is returned (in `out`, if given)."""
    partial = _products(x, weight, split, block_n, block_k, block_m, partial)
    m, n = residual.shape
    assert x.shape[0] == m and weight.shape[0] == n and residual.is_contiguous()
    if out is None:
        out = torch.empty_like(residual)
    block = triton.next_power_of_2(n)
    _add_slices_norm[(m,)](partial, residual, out, norm_weight, m, eps, n, split, block)
    return out
