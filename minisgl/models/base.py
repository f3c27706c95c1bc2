from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from minisgl.layers import BaseOP

if TYPE_CHECKING:
    import torch


class BaseLLMModel(ABC, BaseOP):
    """A causal language model. forward() reads the current batch from the global context
    and returns the logits of the tokens whose next token is wanted."""

    @abstractmethod
    def forward(self) -> torch.Tensor: ...
