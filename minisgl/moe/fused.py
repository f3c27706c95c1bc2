"""The fused MoE backend: every expert's work in two grouped matrix products (Triton).

1. Route: each token's top-k experts and weights (`fused_topk`).
2. Sort the (token, choice) pairs by expert and pad each expert's share to a whole number of
   blocks (`moe_align_block_size`), so that a block of rows needs one expert's weights.
3. gate_up = grouped product with w1; act(gate) * up; down = grouped product with w2, each row
   scaled by its router weight; then each token's top-k rows are summed.

No step waits for the host: the shapes are fixed by the number of tokens, so the backend runs
inside a CUDA graph.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from .base import BaseMoeBackend
from .native import select_experts


def fused_topk(
    hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(weights [tokens, topk] float32, expert ids [tokens, topk] int32), as transformers
    routes (upstream calls sgl-kernel's topk_softmax, one kernel)."""
    assert hidden_states.shape[0] == gating_output.shape[0], "one router row per token"
    weights, ids = select_experts(gating_output, topk, renormalize)
    return weights, ids.to(torch.int32)


def moe_align_block_size(
    topk_ids: torch.Tensor, block_size: int, num_experts: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (token, choice) pairs sorted by expert, each expert's share padded to a multiple of
    `block_size` with the invalid pair number `topk_ids.numel()`.

    Example: topk_ids [[2, 0], [0, 1]] (pairs 0..3 choose experts 2, 0, 0, 1), block_size 2:
    expert 0 has pairs 1, 2; expert 1 has pair 3 and one padding; expert 2 pair 0 and one:
    sorted_ids [1, 2, 3, 4, 0, 4, ...], expert_ids [0, 1, 2, ...], num_tokens_post_padded [6].

    Returns (sorted_ids, expert_ids of each block, num_tokens_post_padded [1]); the first two
    are as long as the worst case, so that their shapes do not depend on the routing."""
    flat = topk_ids.flatten().long()
    pairs = flat.numel()
    # not bincount: its output's length depends on the ids, so it waits for the GPU, and a
    # CUDA graph (chapter 18) cannot capture a wait
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    # each pair's place: its expert's padded start + how many pairs of that expert came before
    order = torch.argsort(flat, stable=True)
    start_of = torch.cumsum(counts, 0) - counts
    rank = torch.arange(pairs, device=flat.device) - start_of[flat[order]]
    max_padded = pairs + num_experts * (block_size - 1)
    sorted_ids = torch.full((max_padded,), pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[padded_start[flat[order]] + rank] = order.to(torch.int32)
    blocks = torch.arange(0, max_padded, block_size, device=flat.device)
    expert_ids = torch.searchsorted(padded_end, blocks, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, expert_ids.to(torch.int32), padded_end[-1:].to(torch.int32)


def get_default_config(num_tokens: int, num_experts: int) -> Dict[str, int]:
    """Tile sizes: small tiles when there are few tokens per expert (decoding)."""
    if num_tokens <= num_experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}


def fused_experts_impl(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    from minisgl.kernel import fused_moe_kernel_triton, moe_sum_reduce_triton
    from minisgl.layers.activation import gelu_and_mul, silu_and_mul

    assert hidden_states.is_contiguous() and w1.is_contiguous() and w2.is_contiguous()
    tokens, hidden = hidden_states.shape
    num_experts, two_inter, _ = w1.shape
    topk = topk_ids.shape[1]
    config = get_default_config(tokens, num_experts)
    sorted_ids, expert_ids, num_padded = moe_align_block_size(
        topk_ids, config["BLOCK_SIZE_M"], num_experts
    )
    weights = topk_weights.contiguous().view(-1)
    dtype = hidden_states.dtype
    gate_up = hidden_states.new_empty(tokens * topk, two_inter)
    fused_moe_kernel_triton(hidden_states, w1, gate_up, weights, topk_ids, sorted_ids,
                            expert_ids, num_padded, False, topk, config, dtype)  # fmt: skip
    activated = hidden_states.new_empty(tokens * topk, two_inter // 2)
    {"silu": silu_and_mul, "gelu": gelu_and_mul}[activation](gate_up, out=activated)
    down = hidden_states.new_empty(tokens, topk, hidden)
    # the second product reads row t of `activated` for pair t: top_k = 1
    fused_moe_kernel_triton(activated, w2, down, weights, topk_ids, sorted_ids,
                            expert_ids, num_padded, True, 1, config, dtype)  # fmt: skip
    output = torch.empty_like(hidden_states)
    moe_sum_reduce_triton(down, output)
    return output


class FusedMoe(BaseMoeBackend):
    def forward(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
        activation: str = "silu",
        apply_router_weight_on_input: bool = False,
    ) -> torch.Tensor:
        assert not apply_router_weight_on_input, "Qwen3-MoE weights the experts' outputs"
        weights, ids = fused_topk(hidden_states, gating_output, topk, renormalize)
        return fused_experts_impl(hidden_states, w1, w2, weights, ids, activation)
