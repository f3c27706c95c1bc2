"""Mistral: Llama's layout under another name (no sliding window is used here)."""

from __future__ import annotations

from .utils import DecoderForCausalLM


class MistralForCausalLM(DecoderForCausalLM):
    has_attn_bias = False
    has_qk_norm = False


__all__ = ["MistralForCausalLM"]
