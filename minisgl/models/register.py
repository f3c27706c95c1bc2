"""Architecture name (from config.json's "architectures") -> model class, imported lazily."""

from __future__ import annotations

import importlib
from typing import Dict, Tuple

from .base import BaseLLMModel
from .config import ModelConfig

_MODEL_REGISTRY: Dict[str, Tuple[str, str]] = {
    "LlamaForCausalLM": (".llama", "LlamaForCausalLM"),
    "MistralForCausalLM": (".mistral", "MistralForCausalLM"),
    "Qwen2ForCausalLM": (".qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": (".qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": (".qwen3_moe", "Qwen3MoeForCausalLM"),
}


def get_model_class(model_architecture: str, model_config: ModelConfig) -> BaseLLMModel:
    """Build (not load) the model for `model_architecture`."""
    if model_architecture not in _MODEL_REGISTRY:
        raise ValueError(
            f"model architecture {model_architecture!r} is not supported; "
            f"supported: {sorted(_MODEL_REGISTRY)}"
        )
    module_name, class_name = _MODEL_REGISTRY[model_architecture]
    module = importlib.import_module(module_name, package=__package__)
    return getattr(module, class_name)(model_config)


__all__ = ["get_model_class"]
