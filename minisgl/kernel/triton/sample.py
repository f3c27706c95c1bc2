"""Temperature sampling in one pass over the logits: the Gumbel-max trick (project P1).

To draw a token from softmax(logits / T), add to every logit / T its own Gumbel noise,
-log(E) with E exponential, and take the argmax: the winner is distributed exactly as the
softmax says. No probability is ever written, no sum over the vocabulary is needed, and the
logits are read once, in their own dtype (bfloat16 in the engine). A row whose temperature
is at most `greedy_below` gets no noise: its argmax.

The noise comes from Philox (Triton's `tl.rand4x`, four numbers a call), seeded per call and
counted by position, so every (row, token) of a call has its own number. A program takes ROWS
rows and BLOCK tokens of the vocabulary and writes its best score and token; the best of the
blocks is taken afterwards. On a CPU it runs under ``TRITON_INTERPRET=1`` (the tests), with the
exact logarithm: the interpreter lacks the GPU's fast one.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _log(x, FAST: tl.constexpr):
    """ln(x): the GPU's fast approximation (lg2.approx and a multiply, CUDA's __logf; an
    error of a few millionths at most, far below what changes a draw) when FAST, else the
    exact one (Triton's CPU interpreter knows only that)."""
    if FAST:
        return libdevice.fast_logf(x)
    return tl.log(x)


@triton.jit
def _exponential(v, FAST: tl.constexpr):
    """E = -log(1 - v) for v uniform in [0, 1): exponential with mean 1. The small E that give
    the largest noise come from small v, which tl.rand4x resolves to 2^-31; near 1, 1 - v would
    keep only float32's 2^-24, so the series v + v^2/2 + v^3/3 takes the smallest v."""
    series = v * (1.0 + v * (0.5 + v * (1.0 / 3.0)))
    return tl.where(v < 1.0 / 1024.0, series, -_log(1.0 - v, FAST))


@triton.jit
def _best_of_quarter(
    logits_ptr, logits_stride, row, row_ok, start, place, vocab, inverse_t, sampled, uniform,
    FAST: tl.constexpr,
):  # fmt: skip
    """The largest score among the tokens start + place of each row, and its token (the
    first on a tie)."""
    tokens = start + place
    valid = row_ok[:, None] & (tokens < vocab)[None, :]
    logits = tl.load(
        logits_ptr + row[:, None].to(tl.int64) * logits_stride + tokens[None, :],
        mask=valid,
        other=0.0,
    ).to(tl.float32)
    # E = 0 (v = 0, one chance in 2^31) would give infinite noise: 2^-32 gives the largest
    noise = -_log(tl.maximum(_exponential(uniform, FAST), 2.3283064e-10), FAST)
    score = logits * inverse_t[:, None] + tl.where(sampled[:, None], noise, 0.0)
    score = tl.where(valid, score, float("-inf"))
    return tl.max(score, 1), start + tl.argmax(score, 1)


@triton.jit
def _keep_better(best, token, other_best, other_token):
    """Strictly better only: on a tie the earlier quarter, with the smaller tokens, stays."""
    better = other_best > best
    return tl.where(better, other_best, best), tl.where(better, other_token, token)


@triton.jit(do_not_specialize=["rows", "seed"])  # one compilation whatever their values
def _gumbel_max_kernel(
    logits_ptr,  # [rows, vocab], any float dtype
    logits_stride,
    temperatures_ptr,  # [rows] float32
    best_score_ptr,  # [rows, blocks] float32: the best perturbed score of each block
    best_token_ptr,  # [rows, blocks] int32: its token
    rows,
    vocab,
    seed,
    greedy_below,  # a row at this temperature or lower takes its argmax
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,  # tokens per program, in four quarters
    FAST: tl.constexpr,  # the GPU's approximate logarithm
):
    """One Philox call makes four numbers: one for the same place in each quarter of the
    block. Philox's multiplications and the logarithms, not the reading of the logits, are
    most of this kernel's work."""
    QUARTER: tl.constexpr = BLOCK // 4
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    row_ok = row < rows
    temperature = tl.load(temperatures_ptr + row, mask=row_ok, other=1.0)
    sampled = temperature > greedy_below
    inverse_t = 1.0 / tl.where(sampled, temperature, 1.0)  # greedy: the logits as they are
    place = tl.arange(0, QUARTER)
    counter = (row[:, None].to(tl.int64) * blocks + block) * QUARTER + place[None, :]
    uniforms = tl.rand4x(seed, counter)
    first = block * BLOCK
    best, token = _best_of_quarter(
        logits_ptr, logits_stride, row, row_ok, first, place, vocab, inverse_t, sampled,
        uniforms[0], FAST,
    )  # fmt: skip
    for quarter in tl.static_range(1, 4):
        score, at = _best_of_quarter(
            logits_ptr, logits_stride, row, row_ok, first + quarter * QUARTER, place, vocab,
            inverse_t, sampled, uniforms[quarter], FAST,
        )  # fmt: skip
        best, token = _keep_better(best, token, score, at)
    out = row * blocks + block
    tl.store(best_score_ptr + out, best, mask=row_ok)
    tl.store(best_token_ptr + out, token, mask=row_ok)


def gumbel_max_sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    greedy_below: float,
    seed: int,
    block: int = 4096,
    rows_per_program: int = 1,
) -> torch.Tensor:
    """One token per row of logits [rows, vocab], drawn from softmax(logits / temperature),
    or the row's argmax where its temperature is at most `greedy_below`. The same seed gives
    the same tokens. Returns int32 [rows]."""
    rows, vocab = logits.shape
    assert logits.stride(1) == 1 and temperatures.shape == (rows,)
    assert block >= 4 and block & (block - 1) == 0, block  # four quarters of a power of 2
    blocks = triton.cdiv(vocab, block)
    best_score = logits.new_empty((rows, blocks), dtype=torch.float32)
    best_token = logits.new_empty((rows, blocks), dtype=torch.int32)
    if rows == 0:
        return best_token.view(-1)
    _gumbel_max_kernel[(triton.cdiv(rows, rows_per_program), blocks)](
        logits,
        logits.stride(0),
        temperatures.float(),
        best_score,
        best_token,
        rows,
        vocab,
        seed,
        greedy_below,
        ROWS=rows_per_program,
        BLOCK=block,
        FAST=os.environ.get("TRITON_INTERPRET") != "1",
    )
    # the best block's token: its score is the row's largest (the first such block on a tie)
    return best_token.gather(1, best_score.argmax(dim=1, keepdim=True)).view(-1)
