"""Token embedding and the LM head (the output projection to vocabulary logits).

The names anticipate chapter 16, where each rank holds a slice of the vocabulary. A model with
tied embeddings (SmolLM2, Qwen3-0.6B, Llama 3.2) uses the embedding matrix as its LM head and
stores no separate `lm_head.weight`.
"""

from __future__ import annotations

from typing import Dict

import torch
import torch.nn.functional as F

from .base import BaseOP


class VocabParallelEmbedding(BaseOP):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.weight = torch.empty(num_embeddings, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.embedding(x, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        bias: bool = False,
        tie_word_embeddings: bool = False,
        tied_embedding: VocabParallelEmbedding | None = None,
    ) -> None:
        assert (tied_embedding is not None) == tie_word_embeddings, (
            "pass the embedding to tie to exactly when tie_word_embeddings is set"
        )
        super().__init__(num_embeddings, embedding_dim)
        self.bias = torch.empty(num_embeddings) if bias else None
        self.tied_embedding = tied_embedding
        if tied_embedding is not None:
            del self.weight  # the embedding's matrix is used instead

    def state_dict(
        self, *, prefix: str = "", result: Dict[str, torch.Tensor] | None = None
    ) -> Dict[str, torch.Tensor]:
        if self.tied_embedding is None:
            return super().state_dict(prefix=prefix, result=result)
        return {} if result is None else result  # the embedding saves the shared matrix

    def load_state_dict(
        self, state_dict: Dict[str, torch.Tensor], *, prefix: str = "", _internal: bool = False
    ) -> None:
        if self.tied_embedding is None:
            return super().load_state_dict(state_dict, prefix=prefix, _internal=_internal)
        # some tied checkpoints still carry a copy of the head: it is not needed
        state_dict.pop(f"{prefix}.weight", None)
        state_dict.pop(f"{prefix}.bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.tied_embedding.weight if self.tied_embedding is not None else self.weight
        return F.linear(x, weight, self.bias)
