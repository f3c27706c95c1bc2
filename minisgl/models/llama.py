"""Llama 2 and 3 (and SmolLM2, which is a small Llama): no attention bias, no q/k norm."""

from __future__ import annotations

from .utils import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    has_attn_bias = False
    has_qk_norm = False


__all__ = ["LlamaForCausalLM"]
