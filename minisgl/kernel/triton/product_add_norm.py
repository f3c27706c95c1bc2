"""A product with few outputs and the add-and-norm after it, in two launches (project P1).

The o and down products of a decoder layer have as many outputs as the model's hidden size
(1,024 for Qwen3-0.6B) and long sums (2,048 and 3,072 inputs). At a decode step's few hundred
rows that is few output tiles for cuBLAS to share between the GPU's 132 multiprocessors, each
tile summing over every input. After each product the layer adds it to the residual stream
and normalises the sum (FlashInfer's `fused_add_rmsnorm`): a second launch.

Here the sum over the inputs is cut into `slices`: program (n, s, m) sums slice s for
output tile n and row tile m into a float32 buffer [slices, rows, outputs], so the GPU gets
`slices` times the programs. The second launch, one program per row, adds the slices, rounds
the product to the stream's dtype (as cuBLAS's output is), adds it to the residual in float32,
stores the sum rounded, and writes the RMS norm of the unrounded sum, as FlashInfer does. Two
launches, as before; the slices' sum costs none of its own.

With `gated`, the product's input is the MLP's silu(gate) * up, made while it is loaded from
the gate/up product's output [rows, 2 x inputs] (gate first) and rounded to its dtype as
FlashInfer's `silu_and_mul` rounds it: down then needs no SiLU kernel before it.

Sums run in another order than cuBLAS's and FlashInfer's, so 16-bit results may differ from
theirs in the last bit. For up to `MAX_ROWS` rows; on a CPU it runs under ``TRITON_INTERPRET=1``
(the tests, in float32).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Tuple

import torch
import triton
import triton.language as tl

MAX_ROWS = 256  # the most rows it is used for: a decode step's, the largest CUDA graph's


@dataclass(frozen=True)
class SplitTile:
    """The sum cut into `slices`; a program's `block_m` rows, `block_n` outputs, `block_k`
    inputs a load; the launch's warps and pipeline stages."""

    slices: int
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


# inputs (K) -> ((most rows, tile), ...): the first whose rows cover the batch. Shapes not
# listed take DEFAULT_TILES.
SPLIT_TILES: Dict[int, Tuple[Tuple[int, SplitTile], ...]] = {
    2048: (
        (64, SplitTile(slices=4, block_m=16, block_n=32, block_k=128)),
        (MAX_ROWS, SplitTile(slices=2, block_m=64, block_n=64, block_k=64)),
    ),
    3072: (
        (64, SplitTile(slices=4, block_m=16, block_n=32, block_k=128)),
        (MAX_ROWS, SplitTile(slices=2, block_m=64, block_n=64, block_k=64)),
    ),
}
DEFAULT_TILES: Tuple[Tuple[int, SplitTile], ...] = (
    (64, SplitTile(slices=4, block_m=16, block_n=32, block_k=64)),
    (MAX_ROWS, SplitTile(slices=2, block_m=64, block_n=64, block_k=64)),
)


@functools.lru_cache(maxsize=8)
def parse_tiles(text: str) -> Dict[int, Tuple[Tuple[int, SplitTile], ...]]:
    """Tiles written as "K:rows=slices,block_m,block_n,block_k;..." (MINISGL_SPLIT_TILES, for
    trying a table without editing this file), grouped by K, fewest rows first."""
    table: Dict[int, list] = {}
    for entry in filter(None, text.replace(" ", "").split(";")):
        shape, numbers = entry.split("=")
        k, rows = map(int, shape.split(":"))
        table.setdefault(k, []).append((rows, SplitTile(*map(int, numbers.split(",")))))
    return {k: tuple(sorted(tiles, key=lambda t: t[0])) for k, tiles in table.items()}


def split_tile(k: int, rows: int) -> SplitTile:
    from minisgl.env import ENV

    tiles = parse_tiles(ENV.SPLIT_TILES.value).get(k) or SPLIT_TILES.get(k, DEFAULT_TILES)
    return next((tile for most, tile in tiles if rows <= most), tiles[-1][1])


@triton.jit
def _slice_products(
    x,  # [M, K], or [M, 2K] (gate, up) when GATED
    weight,  # [N, K]
    partial,  # [SLICES, M, N] float32
    M,
    N,
    K,
    x_stride,
    K_SLICE: tl.constexpr,  # inputs a slice, a multiple of BLOCK_K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for float32 inputs (exact products, not TF32)
    GATED: tl.constexpr = False,  # the input is silu(x[:, :K]) * x[:, K:]
):
    tile, piece, row_tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    outputs = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in, output_in = rows < M, outputs < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(0, K_SLICE, BLOCK_K):
        inputs = piece * K_SLICE + start + tl.arange(0, BLOCK_K)
        input_in = inputs < K
        at_x = x + rows[:, None] * x_stride + inputs[None, :]
        inside = row_in[:, None] & input_in[None, :]
        a = tl.load(at_x, mask=inside, other=0.0)
        if GATED:
            gate = a.to(tl.float32)
            up = tl.load(at_x + K, mask=inside, other=0.0).to(tl.float32)
            a = (gate * tl.sigmoid(gate) * up).to(x.dtype.element_ty)
        b = tl.load(weight + outputs[:, None] * K + inputs[None, :],
                    mask=output_in[:, None] & input_in[None, :], other=0.0)  # fmt: skip
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    at = partial + (piece * M + rows[:, None]) * N + outputs[None, :]
    tl.store(at, acc, mask=row_in[:, None] & output_in[None, :])


@triton.jit
def _add_slices_rmsnorm(
    partial,  # [SLICES, M, N] float32
    residual,  # [M, N], updated in place
    out,  # [M, N]
    norm_weight,  # [N]
    M,
    eps,
    N: tl.constexpr,
    SLICES: tl.constexpr,
    BLOCK: tl.constexpr,  # N rounded up to a power of two
):
    row = tl.program_id(0)
    columns = tl.arange(0, BLOCK)
    inside = columns < N
    product = tl.zeros((BLOCK,), tl.float32)
    for piece in range(SLICES):
        product += tl.load(partial + (piece * M + row) * N + columns, mask=inside, other=0.0)
    dtype = residual.dtype.element_ty
    stream = product.to(dtype).to(tl.float32)  # the product as F.linear would return it
    stream += tl.load(residual + row * N + columns, mask=inside, other=0.0).to(tl.float32)
    tl.store(residual + row * N + columns, stream.to(dtype), mask=inside)
    scale = tl.math.rsqrt(tl.sum(stream * stream, axis=0) / N + eps)
    weight = tl.load(norm_weight + columns, mask=inside, other=0.0).to(tl.float32)
    tl.store(out + row * N + columns, (stream * scale * weight).to(dtype), mask=inside)


def product_add_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    tile: SplitTile | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """What `y = F.linear(x, weight)` and FlashInfer's `fused_add_rmsnorm(y, residual,
    norm_weight, eps)` compute: `residual` becomes residual + y (in place), and the RMS norm
    of that sum is returned; with `gated`, `y = F.linear(silu_and_mul(x), weight)`. `tile`
    overrides the table's."""
    (rows, columns), (n, k) = x.shape, weight.shape
    assert columns == (2 * k if gated else k), (x.shape, weight.shape, gated)
    assert residual.shape == (rows, n) and residual.is_contiguous(), (x.shape, residual.shape)
    assert x.stride(1) == 1 and weight.is_contiguous() and x.dtype == weight.dtype
    out = torch.empty_like(residual)
    if rows == 0:
        return out
    tile = tile or split_tile(k, rows)
    k_slice = triton.cdiv(triton.cdiv(k, tile.slices), tile.block_k) * tile.block_k
    slices = triton.cdiv(k, k_slice)  # no slice left empty
    partial = torch.empty(slices, rows, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(n, tile.block_n), slices, triton.cdiv(rows, tile.block_m))
    _slice_products[grid](
        x,
        weight,
        partial,
        rows,
        n,
        k,
        x.stride(0),
        K_SLICE=k_slice,
        BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # 16 bits: no effect
        GATED=gated,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    block = triton.next_power_of_2(n)
    _add_slices_rmsnorm[(rows,)](partial, residual, out, norm_weight, rows, eps, n, slices, block)
    return out


__all__ = [
    "DEFAULT_TILES",
    "MAX_ROWS",
    "SPLIT_TILES",
    "SplitTile",
    "parse_tiles",
    "product_add_rmsnorm",
    "split_tile",
]
