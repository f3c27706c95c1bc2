"""FlashInfer's fused kernels for the small ops of a layer, where they apply.

On a GPU in float16 or bfloat16, RMSNorm (alone and fused with the residual add), SiLU-and-mul
and RoPE call FlashInfer's kernels, as upstream always does: each is one kernel where the
PyTorch code launches four to ten small ones, and a decode step runs about a hundred norms.
In float32, and on a CPU, the layers keep their PyTorch code, which computes what transformers
computes operation for operation (FlashInfer has no float32 kernels for them, and its fused
arithmetic rounds differently).
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from minisgl.env import ENV

_NEEDED = ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "apply_rope_with_cos_sin_cache_inplace")


@functools.cache
def _flashinfer() -> ModuleType | None:
    try:
        import flashinfer
    except ImportError:
        return None
    # a stand-in module (the book's CPU fake of the attention API) has none of these
    return flashinfer if all(hasattr(flashinfer, name) for name in _NEEDED) else None


def flashinfer_for(x: torch.Tensor) -> ModuleType | None:
    """FlashInfer, if its fused kernels apply to `x` (a CUDA tensor of a 16-bit dtype) and
    MINISGL_DISABLE_CUSTOM_KERNELS is not set."""
    if ENV.DISABLE_CUSTOM_KERNELS or not x.is_cuda:
        return None
    if x.dtype not in (torch.float16, torch.bfloat16):
        return None
    return _flashinfer()


__all__ = ["flashinfer_for"]
