"""The reference MoE backend: the router's choice as transformers makes it, then a loop over
the experts, each running on the tokens that chose it."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from .base import BaseMoeBackend


def select_experts(
    gating_output: torch.Tensor, topk: int, renormalize: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each token's `topk` experts and their weights: the softmax of the router's logits (in
    float32), the largest `topk` probabilities, divided by their sum if `renormalize`.
    Returns (weights [tokens, topk] float32, expert ids [tokens, topk] int64)."""
    probabilities = torch.softmax(gating_output, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probabilities, topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}


class TorchMoe(BaseMoeBackend):
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
        weights, ids = select_experts(gating_output, topk, renormalize)
        weights = weights.to(hidden_states.dtype)  # transformers casts them back, too
        act = ACTIVATIONS[activation]
        output = torch.zeros_like(hidden_states)
        # the experts in increasing order, each adding into the output: transformers' order
        for expert in torch.unique(ids).tolist():
            token, slot = torch.where(ids == expert)
            gate, up = F.linear(hidden_states[token], w1[expert]).chunk(2, dim=-1)
            out = F.linear(act(gate) * up, w2[expert]) * weights[token, slot, None]
            output.index_add_(0, token, out)
        return output
