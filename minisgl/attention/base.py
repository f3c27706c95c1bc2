"""The attention backend interface.

Before a batch runs, `prepare_metadata` turns the batch into whatever the backend's kernels
need (sequence lengths, offsets, the batch's rows of the page table) and stores it in
`batch.attn_metadata`. Then every layer calls `forward`, which writes the new keys and values
into the KV pool and attends over each request's tokens. The metadata is built once per batch
and shared by all layers.

For CUDA graphs (chapter 18), a backend keeps the metadata of decode batches in fixed buffers:
`init_capture_graph` allocates them for the largest batch, `prepare_for_capture` points a
capture batch's metadata at them, and `prepare_for_replay` copies a real batch's metadata into
them before its graph replays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, List

if TYPE_CHECKING:
    import torch

    from minisgl.core import Batch


@dataclass
class BaseAttnMetadata(ABC):
    @abstractmethod
    def get_last_indices(self, bs: int) -> torch.Tensor:
        """Index of each request's last token in the batch (whose logits sample the next one)."""


class BaseAttnBackend(ABC):
    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer_id: int,
        batch: Batch,
    ) -> torch.Tensor:
        """Store k and v at batch.out_loc (None: the layer stored them), then attend:
        q [tokens, heads, head_dim] -> same."""

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None: ...

    @abstractmethod
    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        """Allocate the fixed metadata buffers for decode batches of up to max(bs_list)
        requests of up to max_seq_len tokens."""

    @abstractmethod
    def prepare_for_capture(self, batch: Batch) -> None:
        """Set the metadata of a capture batch (padded_size in bs_list) on the buffers."""

    @abstractmethod
    def prepare_for_replay(self, batch: Batch) -> None:
        """Copy the metadata of a prepared decode batch into the buffers its graph reads."""


class HybridBackend(BaseAttnBackend):
    """One backend for prefill batches and another for decode batches (their best kernels
    differ: many queries per request against one)."""

    def __init__(self, prefill_backend: BaseAttnBackend, decode_backend: BaseAttnBackend) -> None:
        self.prefill_backend = prefill_backend
        self.decode_backend = decode_backend

    def _pick(self, batch: Batch) -> BaseAttnBackend:
        return self.prefill_backend if batch.is_prefill else self.decode_backend

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer_id: int,
        batch: Batch,
    ) -> torch.Tensor:
        return self._pick(batch).forward(q, k, v, layer_id, batch)

    def prepare_metadata(self, batch: Batch) -> None:
        self._pick(batch).prepare_metadata(batch)

    # graphs are for decode batches only
    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        self.decode_backend.init_capture_graph(max_seq_len, bs_list)

    def prepare_for_capture(self, batch: Batch) -> None:
        self.decode_backend.prepare_for_capture(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        self.decode_backend.prepare_for_replay(batch)
