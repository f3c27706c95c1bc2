"""Launching the fused MoE kernels of ``triton/fused_moe.py``."""

from __future__ import annotations

from typing import Dict

import torch


def fused_moe_kernel_triton(
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    mul_routed_weight: bool,
    top_k: int,
    config: Dict[str, int],
    compute_type: torch.dtype,
) -> None:
    """C[t] = A[t // top_k] @ B[expert of t].T for every (token, choice) pair t; C is
    [pairs, N] (or a view of that shape), B is [experts, N, K]."""
    import triton

    from .triton.fused_moe import fused_moe_kernel

    assert A.stride(1) == 1 and B.stride(2) == 1 and C.stride(-1) == 1
    assert topk_weights.is_contiguous() and sorted_token_ids.is_contiguous()
    N, K = B.shape[1], B.shape[2]
    C = C.view(-1, N)
    grid = (
        triton.cdiv(sorted_token_ids.shape[0], config["BLOCK_SIZE_M"])
        * triton.cdiv(N, config["BLOCK_SIZE_N"]),
    )
    fused_moe_kernel[grid](
        A,
        B,
        C,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        N,
        K,
        topk_ids.numel(),
        A.stride(0),
        B.stride(0),
        B.stride(1),
        C.stride(0),
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
        BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k,
        PRECISION="ieee" if compute_type == torch.float32 else "tf32",
    )


def moe_sum_reduce_triton(input: torch.Tensor, output: torch.Tensor) -> None:
    """output[t] = input[t].sum(0): input [tokens, top_k, hidden], output [tokens, hidden]."""
    import triton

    from .triton.fused_moe import moe_sum_reduce_kernel

    assert input.is_contiguous() and output.is_contiguous()
    tokens, top_k, hidden = input.shape
    block = min(triton.next_power_of_2(hidden), 1024)
    grid = (tokens, triton.cdiv(hidden, block))
    moe_sum_reduce_kernel[grid](input, output, top_k, hidden, BLOCK_DIM=block)
