"""Hugging Face configs, tokenizers and weights, from a local folder or a Hub model id."""

from __future__ import annotations

import functools
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # transformers is imported where it is used: the API server never needs it
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


@functools.lru_cache(maxsize=None)
def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer, loaded once per process and path: every caller shares it, so
    none may change it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if not getattr(tokenizer, "chat_template", None):
        # some repositories (Mistral's) keep the template in a file of its own
        template = _read_chat_template(model_path)
        if template is not None:
            tokenizer.chat_template = template
    return tokenizer


def _read_chat_template(model_path: str) -> str | None:
    try:
        if os.path.isdir(model_path):
            path = os.path.join(model_path, "chat_template.json")
        else:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(repo_id=model_path, filename="chat_template.json")
        with open(path, encoding="utf-8") as f:
            return json.load(f)["chat_template"]
    except Exception:  # no such file: the model simply has no chat template
        return None


@functools.cache
def _load_hf_config(model_path: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path)


def cached_load_hf_config(model_path: str) -> PretrainedConfig:
    """The model's config, read once per process; each caller gets its own copy to change."""
    config = _load_hf_config(model_path)
    return type(config)(**config.to_dict())


def download_hf_weight(model_path: str) -> str:
    """A local folder holding the model's *.safetensors files (downloaded for a Hub id)."""
    if os.path.isdir(model_path):
        return model_path
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model_path, allow_patterns=["*.safetensors", "*.json"])
    except Exception as e:
        raise ValueError(
            f"model path {model_path!r} is neither a local folder nor a reachable model id: {e}"
        ) from e
