"""A model of the package, built from one of the book's reference checkpoints (chapter 03)."""

from __future__ import annotations

from typing import Tuple

import torch

from minisgl.layers import set_rope_device
from minisgl.models import BaseLLMModel, ModelConfig, create_model, load_weight
from minisgl.utils import cached_load_hf_config, torch_dtype
from tools.models import ensure_model
from tools.parity import book_device, book_dtype


def build(name: str) -> Tuple[ModelConfig, BaseLLMModel, int]:
    """(its config, the model, how many tensors the loader yielded) for reference model
    `name`, on the book's device and in its dtype."""
    path, device, dtype = str(ensure_model(name)), torch.device(book_device()), book_dtype()
    config = ModelConfig.from_hf(cached_load_hf_config(path))
    set_rope_device(device)
    with torch.device("meta"), torch_dtype(dtype):  # shapes only: the loader fills them in
        model = create_model(config)
    weights = {k: v.to(dtype) for k, v in load_weight(path, device)}
    count = len(weights)
    model.load_state_dict(weights)
    return config, model, count
