"""The experts of a mixture-of-experts layer: their weights, stacked, and a call to the
engine's MoE backend (chapter 20)."""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import DistributedCommunicator, tp_info_or_one
from minisgl.utils import div_even

from .base import BaseOP


class MoELayer(BaseOP):
    """`num_experts` gated MLPs of `intermediate_size`, of which each token uses `top_k`.

    With tensor parallelism every rank holds every expert, each cut like a dense MLP: a slice of
    the intermediate size (rows of gate_up_proj, columns of down_proj); an all-reduce adds the
    ranks' partial outputs."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool = True,
        activation: str = "silu",
        apply_router_weight_on_input: bool = False,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.renormalize = renormalize
        self.activation = activation
        self.apply_router_weight_on_input = apply_router_weight_on_input
        self.tp_size = tp_info_or_one().size
        self._comm = DistributedCommunicator()
        local = div_even(intermediate_size, self.tp_size)
        self.gate_up_proj = torch.empty(num_experts, 2 * local, hidden_size)
        self.down_proj = torch.empty(num_experts, hidden_size, local)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        output = get_global_ctx().moe_backend.forward(
            hidden_states=hidden_states,
            w1=self.gate_up_proj,
            w2=self.down_proj,
            gating_output=router_logits,
            topk=self.top_k,
            renormalize=self.renormalize,
            activation=self.activation,
            apply_router_weight_on_input=self.apply_router_weight_on_input,
        )
        return self._comm.all_reduce(output) if self.tp_size > 1 else output
