"""Qwen3-MoE: Qwen3's attention (q/k norms, no bias), and in every layer a mixture of experts
in place of the MLP (`MoEMLP`, chosen by the decoder layer from the config)."""

from __future__ import annotations

from .utils import DecoderForCausalLM


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    has_attn_bias = False
    has_qk_norm = True


__all__ = ["Qwen3MoeForCausalLM"]
