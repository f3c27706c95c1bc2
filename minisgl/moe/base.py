"""The interface of a mixture-of-experts backend: route every token, run its experts, sum."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class BaseMoeBackend(ABC):
    @abstractmethod
    def forward(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
        activation: str,
        apply_router_weight_on_input: bool,
    ) -> torch.Tensor:
        """hidden_states [tokens, hidden]; w1 [experts, 2 * intermediate, hidden] (gate and up
        side by side); w2 [experts, hidden, intermediate]; gating_output [tokens, experts], the
        router's logits. Each token goes to its `topk` best experts, and the result is the sum
        of their outputs weighted by the router's probabilities (renormalised over the chosen
        experts if `renormalize`): [tokens, hidden]."""
