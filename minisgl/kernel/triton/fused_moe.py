"""The fused MoE kernels in Triton, simplified from upstream's.

`fused_moe_kernel` is a grouped matrix product: C[t] = A[t // top_k] @ B[expert(t)].T for every
(token, choice) pair t, all experts in one launch. The pairs come sorted by expert and padded
so that each block of BLOCK_SIZE_M rows belongs to one expert (`moe_align_block_size`): a
program computes one [BLOCK_SIZE_M, BLOCK_SIZE_N] tile of C with one expert's weights, its
rows gathered from A through `sorted_token_ids`. `moe_sum_reduce_kernel` adds each token's
top_k results.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fused_moe_kernel(
    a_ptr,  # [tokens, K]: the input rows
    b_ptr,  # [experts, N, K]: the experts' weights
    c_ptr,  # [tokens * top_k, N]: one output row per (token, choice) pair
    topk_weights_ptr,  # [tokens * top_k] float32: the router's weight of each pair
    sorted_token_ids_ptr,  # the pairs sorted by expert; padding holds num_valid_tokens
    expert_ids_ptr,  # the expert of each block of BLOCK_SIZE_M sorted pairs
    num_tokens_post_padded_ptr,  # how many sorted entries are in use (padding included)
    N,
    K,
    num_valid_tokens,  # tokens * top_k
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    top_k: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for float32 (no TF32 rounding), else "tf32"
):
    pid = tl.program_id(0)
    num_pid_n = (N + BLOCK_SIZE_N - 1) // BLOCK_SIZE_N  # (tl.cdiv is itself a jit function)
    pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return  # a block past the last expert's padding
    pairs = tl.load(sorted_token_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
    pairs = pairs.to(tl.int64)
    valid = pairs < num_valid_tokens  # padding rows compute nothing and store nothing
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    ks = tl.arange(0, BLOCK_SIZE_K)
    a_rows = a_ptr + (pairs // top_k)[:, None] * stride_am  # pair t reads token t // top_k
    b_cols = b_ptr + expert * stride_be + cols[None, :] * stride_bn  # B[expert].T, K down
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_SIZE_K):
        in_k = k0 + ks < K
        a = tl.load(a_rows + (k0 + ks)[None, :], mask=valid[:, None] & in_k[None, :], other=0.0)
        b_mask = in_k[:, None] & (cols[None, :] < N)
        b = tl.load(b_cols + (k0 + ks)[:, None], mask=b_mask, other=0.0)
        acc += tl.dot(a, b, input_precision=PRECISION)
    if MUL_ROUTED_WEIGHT:
        acc *= tl.load(topk_weights_ptr + pairs, mask=valid, other=0.0)[:, None]
    c = c_ptr + pairs[:, None] * stride_cm + cols[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < N))


@triton.jit
def moe_sum_reduce_kernel(
    input_ptr,  # [tokens, top_k, hidden]
    output_ptr,  # [tokens, hidden]
    top_k: tl.constexpr,
    hidden,
    BLOCK_DIM: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_DIM + tl.arange(0, BLOCK_DIM)
    in_row = cols < hidden
    acc = tl.zeros((BLOCK_DIM,), dtype=tl.float32)
    for choice in range(top_k):  # in order: choice 0 first, like a sum over dim 1
        acc += tl.load(input_ptr + (token * top_k + choice) * hidden + cols, mask=in_row, other=0.0)
    tl.store(output_ptr + token * hidden + cols, acc.to(output_ptr.dtype.element_ty), mask=in_row)
