"""The MLP's gate and up products and SiLU, in one kernel (project P1).

A decode step's MLP is three launches per layer: the gate/up product (cuBLAS), SiLU-and-mul
(FlashInfer), the down product (cuBLAS). The middle one reads the product's output [rows,
2 * I] and writes [rows, I]: at decode a few hundred kilobytes, a few microseconds of which
most is the launch itself. Here the product's tile ends with the activation instead: program
(n, m) computes, for rows m and intermediate columns n, both x @ gate[n]^T and x @ up[n]^T
(the same x tile, two weight tiles: gate's rows n and up's rows I + n of the merged weight),
then silu(gate) * up, and writes only that. One launch fewer per layer, and the product's
output never goes to memory.

Each product is rounded to the output's dtype before the activation, as the separate kernels
see it; the sums inside a tile run in another order than cuBLAS's, so results in 16 bits may
differ from the unfused path's in the last bit. For up to `MAX_ROWS` rows only: on an H100,
at more rows cuBLAS's product and the separate SiLU were as fast or faster (`python
tools/bench_p1.py gate-up`). On a CPU it runs under ``TRITON_INTERPRET=1`` (the tests, in
float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
import triton
import triton.language as tl

MAX_ROWS = 64  # the most rows it is used for (above, cuBLAS and SiLU were as fast on an H100)


@dataclass(frozen=True)
class GateUpTile:
    """A program's share: `block_m` rows, `block_n` intermediate columns (of gate and of up
    each), `block_k` inputs a load; and the launch's warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


# (most rows, tile): the first whose rows cover the batch; the fastest of `bench_p1.py
# gate-up`'s candidates at 1, 24 and 40 to 64 rows on an H100. Above MAX_ROWS, the last
# (the benchmark times the kernel there too).
GATE_UP_TILES: Tuple[Tuple[int, GateUpTile], ...] = (
    (16, GateUpTile(block_m=16, block_n=32, block_k=128, num_stages=3)),
    (32, GateUpTile(block_m=16, block_n=64, block_k=128, num_stages=3)),
    (MAX_ROWS, GateUpTile(block_m=64, block_n=32, block_k=128, num_stages=4)),
)


def gate_up_tile(rows: int) -> GateUpTile:
    return next((tile for most, tile in GATE_UP_TILES if rows <= most), GATE_UP_TILES[-1][1])


@triton.jit
def _gate_up_silu_kernel(
    x,  # [M, K]
    weight,  # [2 * I, K]: gate's rows, then up's
    out,  # [M, I]
    M,
    K,
    INTER,  # I, the intermediate size
    x_stride,
    out_stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for float32 inputs (exact products, not TF32)
):
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    columns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in, column_in = rows < M, columns < INTER
    gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(0, K, BLOCK_K):
        inputs = start + tl.arange(0, BLOCK_K)
        input_in = inputs < K
        a = tl.load(x + rows[:, None] * x_stride + inputs[None, :],
                    mask=row_in[:, None] & input_in[None, :], other=0.0)  # fmt: skip
        w_mask = column_in[:, None] & input_in[None, :]
        w_gate = tl.load(weight + columns[:, None] * K + inputs[None, :], mask=w_mask, other=0.0)
        w_up = tl.load(weight + (INTER + columns[:, None]) * K + inputs[None, :], mask=w_mask,
                       other=0.0)  # fmt: skip
        gate = tl.dot(a, tl.trans(w_gate), gate, input_precision=PRECISION)
        up = tl.dot(a, tl.trans(w_up), up, input_precision=PRECISION)
    dtype = out.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)  # rounded as the product's output would be
    up = up.to(dtype).to(tl.float32)
    result = gate * tl.sigmoid(gate) * up
    at = out + rows[:, None] * out_stride + columns[None, :]
    tl.store(at, result.to(dtype), mask=row_in[:, None] & column_in[None, :])


def gate_up_silu_triton(
    x: torch.Tensor, weight: torch.Tensor, tile: GateUpTile | None = None
) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for x [rows, K] and the merged weight [2 * I, K] (gate's
    rows first), as `silu_and_mul(F.linear(x, weight))`; `tile` overrides the table's."""
    (rows, k), (two_i, k_w) = x.shape, weight.shape
    assert k == k_w and two_i % 2 == 0 and x.dtype == weight.dtype, (x.shape, weight.shape)
    assert x.stride(1) == 1 and weight.is_contiguous()
    intermediate = two_i // 2
    out = torch.empty(rows, intermediate, device=x.device, dtype=x.dtype)
    if rows == 0:
        return out
    tile = tile or gate_up_tile(rows)
    grid = (triton.cdiv(intermediate, tile.block_n), triton.cdiv(rows, tile.block_m))
    _gate_up_silu_kernel[grid](
        x,
        weight,
        out,
        rows,
        k,
        intermediate,
        x.stride(0),
        out.stride(0),
        BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # 16 bits: no effect
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    return out


__all__ = ["GATE_UP_TILES", "MAX_ROWS", "GateUpTile", "gate_up_silu_triton", "gate_up_tile"]
