"""RMSNorm, and the fused "add the residual, then normalise" that every decoder layer uses."""

from __future__ import annotations

from typing import Tuple

import torch

from .base import BaseOP


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 like transformers."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


class RMSNorm(BaseOP):
    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def forward_inplace(self, x: torch.Tensor) -> None:
        """Normalise x in place (Qwen3's q and k norms work on views of the qkv output)."""
        x.copy_(rms_norm(x, self.weight, self.eps))


class RMSNormFused(BaseOP):
    """The pre-norm of a decoder layer: the residual stream and the normalised input.

    forward(x, None) starts the stream: it returns (norm(x), x).
    forward(x, residual) adds the sub-layer output x to the stream first:
    it returns (norm(x + residual), x + residual).
    """

    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        return rms_norm(x, self.weight, self.eps), x
