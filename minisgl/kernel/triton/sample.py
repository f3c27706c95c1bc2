"""Temperature sampling in one pass over the logits: the Gumbel-max trick (project P1).

To draw a token from softmax(logits / T), add to every logit / T its own Gumbel noise,
-log(E) with E exponential, and take the argmax: the winner is distributed exactly as the
softmax says. No probability is ever written, no sum over the vocabulary is needed, and the
logits are read once, in their own dtype (bfloat16 in the engine). A row whose temperature
is at most `greedy_below` gets no noise: its argmax.

The noise comes from Philox (Triton's `tl.rand`), seeded per call and counted by each logit's
position, so every (row, token) of a call has its own number. A program takes ROWS rows and
BLOCK tokens of the vocabulary and writes its best score and token; the best of the blocks is
taken afterwards. On a CPU it runs under ``TRITON_INTERPRET=1`` (the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _exponential(v):
    """E = -log(1 - v) for v uniform in [0, 1): exponential with mean 1. The small E that give
    the largest noise come from small v, which tl.rand resolves to 2^-31; near 1, 1 - v would
    keep only float32's 2^-24, so the series v + v^2/2 + v^3/3 takes the smallest v."""
    series = v * (1.0 + v * (0.5 + v * (1.0 / 3.0)))
    return tl.where(v < 1.0 / 1024.0, series, -tl.log(1.0 - v))


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
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    block = tl.program_id(1)
    token = block * BLOCK + tl.arange(0, BLOCK)
    row_ok = row < rows
    valid = row_ok[:, None] & (token < vocab)[None, :]
    logits = tl.load(
        logits_ptr + row[:, None].to(tl.int64) * logits_stride + token[None, :],
        mask=valid,
        other=0.0,
    ).to(tl.float32)
    temperature = tl.load(temperatures_ptr + row, mask=row_ok, other=1.0)
    sampled = temperature > greedy_below
    temperature = tl.where(sampled, temperature, 1.0)  # greedy: the logits as they are
    uniform = tl.rand(seed, row[:, None].to(tl.int64) * vocab + token[None, :])
    # E = 0 (v = 0, one chance in 2^31) would give infinite noise: 2^-32 gives the largest
    noise = -tl.log(tl.maximum(_exponential(uniform), 2.3283064e-10))
    score = logits / temperature[:, None] + tl.where(sampled[:, None], noise, 0.0)
    score = tl.where(valid, score, float("-inf"))
    out = row * tl.num_programs(1) + block
    tl.store(best_score_ptr + out, tl.max(score, 1), mask=row_ok)
    tl.store(best_token_ptr + out, block * BLOCK + tl.argmax(score, 1), mask=row_ok)


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
    )
    # the best block's token: its score is the row's largest (the first such block on a tie)
    return best_token.gather(1, best_score.argmax(dim=1, keepdim=True)).view(-1)
