"""The few numbers of an HF config that the engine needs, read once into frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class RotaryConfig:
    head_dim: int
    rotary_dim: int
    max_position: int
    base: float
    scaling: Dict[str, Any] | None  # None for plain RoPE; else has "rope_type" and its factors


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int
    rms_norm_eps: float
    rotary_config: RotaryConfig
    hidden_act: str
    tie_word_embeddings: bool
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    model_type: str
    architectures: List[str]

    @property
    def is_moe(self) -> bool:
        return "moe" in self.model_type

    @classmethod
    def from_hf(cls, config: PretrainedConfig) -> ModelConfig:
        if getattr(config, "text_config", None) is not None:  # a multimodal wrapper
            outer, config = config, config.text_config
            for attr in ("architectures", "rope_theta", "rope_scaling", "rope_parameters"):
                if not getattr(config, attr, None) and getattr(outer, attr, None):
                    setattr(config, attr, getattr(outer, attr))
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            num_layers=config.num_hidden_layers,
            num_qo_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            rotary_config=_rotary_config(config, head_dim),
            hidden_act=config.hidden_act,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            num_experts=getattr(config, "num_local_experts", getattr(config, "num_experts", 0))
            or 0,
            num_experts_per_tok=getattr(config, "num_experts_per_tok", 0) or 0,
            moe_intermediate_size=getattr(config, "moe_intermediate_size", 0) or 0,
            norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)),
            model_type=getattr(config, "model_type", "llama"),
            architectures=list(getattr(config, "architectures", None) or ["LlamaForCausalLM"]),
        )


def _rotary_config(config: PretrainedConfig, head_dim: int) -> RotaryConfig:
    """RoPE settings from either config style.

    transformers 5 keeps everything in `rope_parameters` ({"rope_type", "rope_theta", ...});
    older configs have `rope_theta` beside a `rope_scaling` dict (sometimes keyed "type").
    """
    params = getattr(config, "rope_parameters", None)
    if params:
        params = dict(params)
        base = params.pop("rope_theta", None) or getattr(config, "rope_theta", 10000.0)
    else:
        params = dict(getattr(config, "rope_scaling", None) or {})
        base = getattr(config, "rope_theta", None) or params.pop("rope_theta", 10000.0)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    scaling = None if kind == "default" else {"rope_type": kind, **params}
    return RotaryConfig(
        head_dim=head_dim,
        rotary_dim=head_dim,
        max_position=config.max_position_embeddings,
        base=float(base),
        scaling=scaling,
    )
