"""Gated activations: the input holds [gate | up] side by side; the output is act(gate) * up."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    result = F.silu(gate) * up
    return result if out is None else out.copy_(result)


def gelu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    result = F.gelu(gate) * up  # the exact (erf) GELU
    return result if out is None else out.copy_(result)


__all__ = ["silu_and_mul", "gelu_and_mul"]
