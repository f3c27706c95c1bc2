"""RMSNorm, and the fused "add the residual, then normalise" that every decoder layer uses."""

from __future__ import annotations

from typing import Tuple

import torch

from .base import BaseOP
from .gpu import flashinfer_for


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
        if (flashinfer := flashinfer_for(x)) is not None:
            return flashinfer.rmsnorm(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)

    def forward_inplace(self, x: torch.Tensor) -> None:
        """Normalise x in place (Qwen3's q and k norms work on views of the qkv output)."""
        if (flashinfer := flashinfer_for(x)) is not None:
            flashinfer.rmsnorm(x, self.weight, self.eps, out=x)
            return
        x.copy_(rms_norm(x, self.weight, self.eps))


class RMSNormFused(BaseOP):
    """The pre-norm of a decoder layer: the residual stream and the normalised input.

    forward(x, None) starts the stream: it returns (norm(x), x).
    forward(x, residual) adds the sub-layer output x to the stream first:
    it returns (norm(x + residual), x + residual). FlashInfer's fused kernel (on a GPU in 16
    bits) computes both in place, in x and residual: the caller passes tensors it no longer needs.
    """

    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if (flashinfer := flashinfer_for(x)) is not None:
            if residual is None:
                return flashinfer.rmsnorm(x, self.weight, self.eps), x
            flashinfer.fused_add_rmsnorm(x, residual, self.weight, self.eps)
            return x, residual  # residual += x, then x = norm(residual)
        if residual is not None:
            x = x + residual
        return rms_norm(x, self.weight, self.eps), x
