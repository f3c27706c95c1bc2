"""FlashAttention 3 (registered as "fa"), through sgl-kernel's `flash_attn_with_kvcache`.

There is no plan step: one call per layer takes the ragged queries, each request's number of
keys, and a page table whose entries are page numbers. The engine's page table holds a slot
per position (chapter 04); a page's slots are consecutive and start at a multiple of the page
size, so every page_size-th entry, divided by the page size, is the page number.

For CUDA graphs (chapter 18) the decode metadata lives in fixed buffers: a page table as wide
as the longest sequence's pages, and the sequence lengths and key offsets; a replay copies the
batch's values into them. The kernel gets the table's full width and reads only the pages that
each request's length covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import torch

from minisgl.core import Batch, get_global_ctx
from minisgl.utils import device as dev
from minisgl.utils import is_sm100_supported

from .base import BaseAttnBackend, BaseAttnMetadata
from .utils import BaseCaptureData

if TYPE_CHECKING:
    from minisgl.models import ModelConfig


@dataclass
class FAMetadata(BaseAttnMetadata):
    cu_seqlens_k: torch.Tensor  # [bs + 1] int32: offsets of each request's keys
    cu_seqlens_q: torch.Tensor  # [bs + 1] int32: offsets of each request's queries in the batch
    cache_seqlens: torch.Tensor  # [bs] int32: each request's number of keys
    max_seqlen_k: int
    max_seqlen_q: int
    page_table: torch.Tensor  # [bs, pages of the longest request] int32: page numbers

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.cu_seqlens_q[1 : 1 + bs] - 1


class FlashAttentionBackend(BaseAttnBackend):
    def __init__(self, config: ModelConfig) -> None:
        ctx = get_global_ctx()
        self.config = config
        self.kvcache = ctx.kv_cache
        self.page_size = ctx.page_size
        self.scale = config.head_dim**-0.5
        self.version = 4 if is_sm100_supported() else 3  # FlashAttention 4 is for Blackwell
        self.capture: BaseCaptureData | None = None
        self.capture_bs: List[int] = []

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer_id: int,
        batch: Batch,
    ) -> torch.Tensor:
        metadata = batch.attn_metadata
        assert isinstance(metadata, FAMetadata)
        if k is not None and v is not None:  # else the layer stored them (P1)
            self.kvcache.store_kv(k, v, batch.out_loc, layer_id)
        return _fa_sgl_impl(
            q=q,
            k_cache=self.kvcache.k_cache(layer_id),
            v_cache=self.kvcache.v_cache(layer_id),
            page_table=metadata.page_table,
            cache_seqlens=metadata.cache_seqlens,
            cu_seqlens_q=metadata.cu_seqlens_q,
            cu_seqlens_k=metadata.cu_seqlens_k,
            max_seqlen_q=metadata.max_seqlen_q,
            softmax_scale=self.scale,
            version=self.version,
        )

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.padded_reqs
        seqlens_q = [r.extend_len for r in reqs]
        seqlens_k = [r.device_len for r in reqs]
        max_seqlen_q, max_seqlen_k = max(seqlens_q), max(seqlens_k)
        device = self.kvcache.device

        def on_device(values: List[int], offsets: bool = False) -> torch.Tensor:
            host = dev.host_tensor([0] + values if offsets else values, torch.int32, device)
            return dev.to_device(host.cumsum_(dim=0) if offsets else host, device)

        cache_seqlens = on_device(seqlens_k)
        cu_seqlens_k = on_device(seqlens_k, offsets=True)
        if max_seqlen_q == 1:  # decode
            cu_seqlens_q = torch.arange(0, len(reqs) + 1, device=device, dtype=torch.int32)
        elif all(r.cached_len == 0 for r in reqs):  # whole prompts: the same offsets as keys
            cu_seqlens_q = cu_seqlens_k
        else:
            cu_seqlens_q = on_device(seqlens_q, offsets=True)
        table = get_global_ctx().page_table
        rows = torch.stack([table[r.table_idx, : max_seqlen_k : self.page_size] for r in reqs])
        if self.page_size > 1:
            rows = rows.div(self.page_size, rounding_mode="floor")
        batch.attn_metadata = FAMetadata(
            cu_seqlens_k=cu_seqlens_k,
            cu_seqlens_q=cu_seqlens_q,
            cache_seqlens=cache_seqlens,
            max_seqlen_k=max_seqlen_k,
            max_seqlen_q=max_seqlen_q,
            page_table=rows,
        )

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        assert self.capture is None, "graphs are captured once"
        max_pages = max_seq_len // self.page_size
        self.capture = BaseCaptureData.create(max(bs_list), max_pages, self.kvcache.device)
        self.capture_bs = sorted(bs_list)

    def prepare_for_capture(self, batch: Batch) -> None:
        bs, capture = batch.padded_size, self.capture
        assert capture is not None and bs in self.capture_bs
        batch.attn_metadata = FAMetadata(
            cu_seqlens_k=capture.cu_seqlens_k[: bs + 1],
            cu_seqlens_q=capture.cu_seqlens_q[: bs + 1],
            cache_seqlens=capture.seq_lens[:bs],
            max_seqlen_k=capture.page_table.shape[1] * self.page_size,
            max_seqlen_q=1,
            page_table=capture.page_table[:bs],
        )

    def prepare_for_replay(self, batch: Batch) -> None:
        metadata, bs, capture = batch.attn_metadata, batch.padded_size, self.capture
        assert isinstance(metadata, FAMetadata)
        assert capture is not None and bs in self.capture_bs
        # the query offsets are 0, 1, ..., bs in every decode batch: nothing to copy
        width = metadata.page_table.shape[1]
        capture.cu_seqlens_k[: bs + 1].copy_(metadata.cu_seqlens_k)
        capture.seq_lens[:bs].copy_(metadata.cache_seqlens)
        capture.page_table[:bs, :width].copy_(metadata.page_table)


def _fa_sgl_impl(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    softmax_scale: float,
    version: int,
) -> torch.Tensor:
    try:
        from sgl_kernel.flash_attn import flash_attn_with_kvcache
    except ImportError as e:
        raise ImportError(
            "the 'fa' attention backend needs sgl-kernel's FlashAttention (pip install "
            "sgl-kernel, on an H100 or newer); elsewhere use --attention-backend torch or fi"
        ) from e
    return flash_attn_with_kvcache(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        page_table=page_table,
        cache_seqlens=cache_seqlens,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        softmax_scale=softmax_scale,
        causal=True,
        ver=version,
    )
