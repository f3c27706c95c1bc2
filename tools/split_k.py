"""A split-K matrix product in Triton, timed by `python tools/bench_p1.py split-k` against
cuBLAS for the decode step's two products with few outputs (o and down). Not part of the
engine: a candidate, measured. (Its first kernel is the engine's, from
`minisgl/kernel/triton/product_add_norm.py`, whose second kernel goes on with the layer's
add-and-norm; `bench_p1.py split-k-norm` times that form.)

`F.linear(x, weight)` for a few rows `x` [M, K] and a weight [N, K] with N = 1,024 outputs
gives cuBLAS few output tiles to share between the GPU's multiprocessors, and each tile's sum
runs over all K inputs. Here the K inputs are cut into `split` slices: program (n, s, m) sums
slice s for the outputs of tile n and the rows of tile m into a float32 buffer, and a second
kernel adds the slices and rounds to the output's type."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_slices(partial, out, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < MN
    acc = tl.zeros((BLOCK,), tl.float32)
    for piece in range(SPLIT):
        acc += tl.load(partial + piece * MN + offsets, mask=inside, other=0.0)
    tl.store(out + offsets, acc.to(out.dtype.element_ty), mask=inside)


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
    # here, not at the top: every chapter's tree holds this file (chapters/book.toml), and
    # the module exists from project P1 on
    from minisgl.kernel.triton.product_add_norm import _slice_products

    (m, k), n = x.shape, weight.shape[0]
    assert n % block_n == 0 and k % (split * block_k) == 0, (n, k, split, block_n, block_k)
    if block_m is None:
        block_m = max(16, triton.next_power_of_2(m))  # tl.dot takes tiles of 16 rows or more
    if partial is None:
        partial = torch.empty(split, m, n, device=x.device, dtype=torch.float32)
    if out is None:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    grid = (n // block_n, split, triton.cdiv(m, block_m))
    _slice_products[grid](
        x, weight, partial, m, n, k, x.stride(0), k // split, block_m, block_n, block_k, precision
    )
    _add_slices[(triton.cdiv(m * n, 1024),)](partial, out, m * n, split, 1024)
    return out
