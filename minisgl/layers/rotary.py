"""Rotary position embedding (RoPE), with the default, Llama 3 and linear frequency scalings.

Position p rotates each pair (x[i], x[i + d/2]) of a head by the angle p * inv_freq[i]. The
cosines and sines of every angle up to the model's maximum position are computed once, in
float32, and kept in one table: row p = [cos(p * inv_freq) | sin(p * inv_freq)].
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, Tuple

import torch

from .base import StateLessOP
from .gpu import flashinfer_for


class RotaryEmbedding(StateLessOP):
    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        post_process: None | Callable[[torch.Tensor], torch.Tensor] = None,
    ) -> None:
        super().__init__()
        assert rotary_dim == head_size, "partial rotary embeddings are not supported"
        assert head_size % 2 == 0
        self.head_size = head_size
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
        inv_freq = 1.0 / (base**exponents)
        if post_process is not None:
            inv_freq = post_process(inv_freq)
        positions = torch.arange(max_position_embeddings, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)
        self._cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1)  # not a weight

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rotate query [n, heads * d] and key [n, kv_heads * d] in place, by their positions."""
        if (flashinfer := flashinfer_for(query)) is not None:  # the same table, one kernel
            flashinfer.apply_rope_with_cos_sin_cache_inplace(
                positions, query, key, self.head_size, self._cos_sin_cache, is_neox=True
            )
            return query, key
        cos, sin = self._cos_sin_cache[positions.long()].chunk(2, dim=-1)  # [n, d/2] each
        for x in (query, key):
            heads = x.view(x.shape[0], -1, self.head_size)
            first, second = heads.chunk(2, dim=-1)
            c = cos[:, None, :].to(x.dtype)
            s = sin[:, None, :].to(x.dtype)
            rotated = torch.cat([first * c - second * s, second * c + first * s], dim=-1)
            heads.copy_(rotated)
        return query, key


def _llama3_scaling(rope_scaling: Dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    factor: float = rope_scaling["factor"]
    low: float = rope_scaling["low_freq_factor"]
    high: float = rope_scaling["high_freq_factor"]
    original: int = rope_scaling["original_max_position_embeddings"]

    def post_process(inv_freq: torch.Tensor) -> torch.Tensor:
        wavelen = 2 * math.pi / inv_freq
        long_waves = wavelen > original / low  # slowed down by `factor`
        short_waves = wavelen < original / high  # kept as they are
        scaled = torch.where(long_waves, inv_freq / factor, inv_freq)
        if low == high:  # no band in between
            return scaled
        # in between, a ramp from "slowed down" to "kept" (same operation order as
        # transformers, so that both give the same float32 angles)
        smooth = (original / wavelen - low) / (high - low)
        ramp = (1 - smooth) * scaled / factor + smooth * scaled
        return torch.where(long_waves | short_waves, scaled, ramp)

    return post_process


def _get_rope(
    head_dim: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Dict[str, Any] | None = None,
) -> RotaryEmbedding:
    kind = "default" if rope_scaling is None else rope_scaling.get("rope_type", "default")
    if kind == "default":
        return RotaryEmbedding(head_dim, rotary_dim, max_position, base)
    assert rope_scaling is not None
    if kind == "llama3":
        return RotaryEmbedding(
            head_dim, rotary_dim, max_position, base, _llama3_scaling(rope_scaling)
        )
    if kind == "linear":  # positions divided by `factor`, i.e. every frequency slowed down
        factor = float(rope_scaling["factor"])
        return RotaryEmbedding(head_dim, rotary_dim, max_position, base, lambda f: f / factor)
    raise ValueError(f"unsupported RoPE scaling {rope_scaling}")


_ROPE_DEVICE: torch.device | None = None


def set_rope_device(device: torch.device) -> None:
    """Where the cos/sin table goes when models are built on the meta device."""
    global _ROPE_DEVICE
    _ROPE_DEVICE = device


@functools.cache
def get_rope(
    head_dim: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Tuple[Tuple[str, Any], ...] | None = None,
) -> RotaryEmbedding:
    """One shared RotaryEmbedding per configuration (every layer of a model uses the same).

    `rope_scaling` is a tuple of (key, value) pairs, so that it can be a cache key.
    """
    scaling = dict(rope_scaling) if rope_scaling is not None else None
    if torch.empty(0).device.type == "meta":
        # the table holds real numbers, so it cannot live on the meta device
        if _ROPE_DEVICE is None:
            raise RuntimeError("building RoPE on the meta device: call set_rope_device() first")
        with torch.device(_ROPE_DEVICE):
            return _get_rope(head_dim, rotary_dim, max_position, base, scaling)
    return _get_rope(head_dim, rotary_dim, max_position, base, scaling)


__all__ = ["get_rope", "RotaryEmbedding", "set_rope_device"]
