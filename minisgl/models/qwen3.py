"""Qwen3: an RMSNorm on every head of q and k, and no attention bias."""

from __future__ import annotations

from .utils import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    has_attn_bias = False
    has_qk_norm = True


__all__ = ["Qwen3ForCausalLM"]
