"""Qwen2 and Qwen2.5: a bias on the q, k and v projections."""

from __future__ import annotations

from .utils import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    has_attn_bias = True
    has_qk_norm = False


__all__ = ["Qwen2ForCausalLM"]
