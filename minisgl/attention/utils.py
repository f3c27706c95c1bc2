"""The fixed buffers that a backend's CUDA graphs read their metadata from (chapter 18)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class BaseCaptureData:
    """Decode metadata for up to max_bs requests; a graph of batch size bs reads the first bs
    rows. The values at allocation describe a batch of one-token requests whose slot is 0: a
    valid batch for the capture, which runs the step once for real."""

    seq_lens: torch.Tensor  # [max_bs] int32: each request's number of keys
    positions: torch.Tensor  # [max_bs] int32
    cu_seqlens_k: torch.Tensor  # [max_bs + 1] int32: offsets of each request's keys
    cu_seqlens_q: torch.Tensor  # [max_bs + 1] int32: 0, 1, ..., max_bs (one query each)
    page_table: torch.Tensor  # [max_bs, max_seq_len] int32: each request's slots (or pages)

    @classmethod
    def create(cls, max_bs: int, max_seq_len: int, device: torch.device, **kwargs: Any) -> Any:
        def ints(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int32, device=device)

        offsets = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        return cls(
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=device),
            positions=ints(max_bs),
            cu_seqlens_k=offsets.clone(),
            cu_seqlens_q=offsets,
            page_table=ints(max_bs, max_seq_len),
            **kwargs,
        )
