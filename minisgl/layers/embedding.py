"""Token embedding and the LM head, each rank holding one slice of the vocabulary.

With V tokens and N ranks, rank r holds rows [r * ceil(V/N), (r+1) * ceil(V/N)) of the
embedding matrix (the last slice is padded with zero rows when N does not divide V).

* Embedding: a rank looks up the tokens of its slice and writes zeros for the others; an
  all-reduce adds the N partial results, where exactly one rank wrote each token's row.
* LM head: a rank computes the logits of its slice of the vocabulary for every token; an
  all-gather puts the slices side by side, and the padding is cut off.

A model with tied embeddings (SmolLM2, Qwen3-0.6B, Llama 3.2) uses the embedding matrix as its
LM head and stores no separate `lm_head.weight`; both are split the same way.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

from minisgl.distributed import DistributedCommunicator, tp_info_or_one
from minisgl.utils import div_ceil

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
        tp_info = tp_info_or_one()
        self.tp_size = tp_info.size
        self.num_embeddings = num_embeddings
        self.num_embeddings_tp = div_ceil(num_embeddings, self.tp_size)
        start = self.num_embeddings_tp * tp_info.rank
        self.vocab_range = (start, min(start + self.num_embeddings_tp, num_embeddings) - start)
        self.weight = torch.empty(self.num_embeddings_tp, embedding_dim)
        self._comm = DistributedCommunicator()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from minisgl.kernel import indexing

        # with a range, tokens outside this rank's slice get zero rows
        y = indexing(
            weights=self.weight,
            indices=x,
            vocab_range=self.vocab_range if self.tp_size > 1 else None,
        )
        return self._comm.all_reduce(y) if self.tp_size > 1 else y


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
        self.bias = torch.empty(self.num_embeddings_tp) if bias else None
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
        """Logits [tokens, vocabulary] for hidden states [tokens, hidden]."""
        weight = self.tied_embedding.weight if self.tied_embedding is not None else self.weight
        logits = lm_head_logits(x, weight, self.bias)  # [tokens, this rank's slice]
        if self.tp_size == 1:
            return logits
        gathered = self._comm.all_gather(logits)  # [ranks * tokens, slice]: rank by rank
        tokens = logits.shape[0]
        by_token = gathered.view(self.tp_size, tokens, -1).transpose(0, 1)  # [tokens, ranks, slice]
        return by_token.reshape(tokens, -1)[:, : self.num_embeddings]
