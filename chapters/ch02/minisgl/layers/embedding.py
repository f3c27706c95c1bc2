"""Token embedding and the LM head (the output projection to vocabulary logits).

The names anticipate chapter 16, where each rank holds a slice of the vocabulary. A model with
tied embeddings (SmolLM2, Qwen3-0.6B, Llama 3.2) uses the embedding matrix as its LM head and
stores no separate `lm_head.weight`.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

from .base import BaseOP

SWAP_ROWS = 8  # past 8 rows F.linear was as fast or faster on every CPU we timed
_SWAPPED_WINS: Dict[Tuple[Tuple[int, ...], torch.dtype], bool] = {}


def lm_head_logits(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`: logits [tokens, vocabulary] for hidden states [tokens,
    hidden]. On a CPU, a decode step's few rows may go several times faster the other way
    round, as `weight @ x.T`, or several times slower: it depends on the processor, since MKL
    picks its code by CPU. So the head times both ways once per matrix (`_swapped_wins`) and
    keeps the faster. A single row gets a copy of itself as a second column: one column takes
    MKL's matrix-vector path, which is slow too."""
    rows = x.shape[0]
    if x.device.type != "cpu" or not 0 < rows <= SWAP_ROWS or not _swapped_wins(weight):
        return F.linear(x, weight, bias)
    columns = x.T if rows > 1 else torch.cat([x, x]).T
    logits = torch.mm(weight, columns)[:, :rows].T.contiguous()  # [tokens, vocabulary]
    return logits if bias is None else logits + bias


def _swapped_wins(weight: torch.Tensor) -> bool:
    """Whether `weight @ x.T` beat `F.linear` by half again for three rows, the best of three
    calls each, timed the first time this process meets a matrix of this shape (0.1 s for a
    tiny model's head on our test machine, 0.2 s for SmolLM2's)."""
    key = (tuple(weight.shape), weight.dtype)
    if key not in _SWAPPED_WINS:
        probe = torch.zeros(3, weight.shape[1], dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            linear = _best_seconds(lambda: F.linear(probe, weight))
            swapped = _best_seconds(lambda: torch.mm(weight, probe.T))
        _SWAPPED_WINS[key] = 1.5 * swapped < linear
    return _SWAPPED_WINS[key]


def _best_seconds(call: Callable[[], torch.Tensor], calls: int = 3) -> float:
    call()  # the first call may allocate or load code
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return min(times)


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
        return lm_head_logits(x, weight, self.bias)
