"""A paged attention backend in plain PyTorch (registered as "torch").

It runs anywhere and is the reference the GPU backends of chapter 17 are checked against.
The batch's requests are padded to a rectangle: queries [requests, max new tokens] against
keys [requests, max length], with a mask that lets query i of a request (at position
cached_len + i) see that request's keys 0 .. cached_len + i and nothing else. One masked
softmax then serves prefill (many queries, maybe a cached prefix) and decode (one query).

Nothing in `forward` waits for the device (chapter 18): the rectangle's shape and the rows of
the real queries are known on the host when the metadata is made. For CUDA graphs the decode
metadata lives in fixed buffers as wide as the longest sequence; a replay copies the batch's
slots and key mask into them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import torch
import torch.nn.functional as F

from minisgl.core import Batch, get_global_ctx

from .base import BaseAttnBackend, BaseAttnMetadata
from .utils import BaseCaptureData

if TYPE_CHECKING:
    from minisgl.models import ModelConfig


@dataclass
class TorchNativeMetadata(BaseAttnMetadata):
    cu_seqlens_q: torch.Tensor  # [bs + 1] offsets of each request's new tokens in the batch
    query_index: torch.Tensor  # [bs, max_seqlen_q] batch row of each padded query (0 if padding)
    out_index: torch.Tensor  # [tokens] where each real query is in the flattened rectangle
    kv_slots: torch.Tensor  # [bs, max_seqlen_k] KV pool slot of each key position
    kv_valid: torch.Tensor  # [bs, max_seqlen_k] False for padding beyond a request's length
    mask: torch.Tensor  # [bs, 1, max_seqlen_q, max_seqlen_k] which keys each query sees

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.cu_seqlens_q[1 : 1 + bs] - 1


@dataclass
class TorchCaptureData(BaseCaptureData):
    kv_valid: torch.Tensor  # [max_bs, max_seq_len] bool: which columns hold a request's keys
    rows: torch.Tensor  # [max_bs] int64: 0, 1, ..., max_bs - 1


class TorchNativeBackend(BaseAttnBackend):
    def __init__(self, config: ModelConfig) -> None:
        ctx = get_global_ctx()
        self.kvcache = ctx.kv_cache
        self.device = self.kvcache.device
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.capture: TorchCaptureData | None = None
        self.capture_bs: List[int] = []

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.padded_reqs
        device = self.device
        seqlens_q = torch.tensor([r.extend_len for r in reqs], dtype=torch.int64)
        seqlens_k = torch.tensor([r.device_len for r in reqs], dtype=torch.int64)
        cached = seqlens_k - seqlens_q
        max_q, max_k = int(seqlens_q.max()), int(seqlens_k.max())
        cu_seqlens_q = torch.cat([torch.zeros(1, dtype=torch.int64), seqlens_q.cumsum(0)])
        q_offset = torch.arange(max_q)[None, :]  # i: the i-th new token of a request
        query_valid = q_offset < seqlens_q[:, None]
        query_index = torch.where(query_valid, cu_seqlens_q[:-1, None] + q_offset, 0)
        out_index = query_valid.flatten().nonzero().flatten()  # on the host: no device wait
        kv_valid = torch.arange(max_k)[None, :] < seqlens_k[:, None]
        key_pos = torch.arange(max_k)[None, None, :]
        query_pos = (cached[:, None] + q_offset)[:, :, None]  # absolute position of query i
        mask = (key_pos <= query_pos) & query_valid[:, :, None]
        table = get_global_ctx().page_table
        rows = torch.tensor([r.table_idx for r in reqs], device=table.device)
        batch.attn_metadata = TorchNativeMetadata(
            cu_seqlens_q=cu_seqlens_q.to(device=device, dtype=torch.int32),
            query_index=query_index.to(device),
            out_index=out_index.to(device),
            kv_slots=table[rows, :max_k].to(device),
            kv_valid=kv_valid.to(device),
            mask=mask[:, None].to(device),
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        meta = batch.attn_metadata
        assert isinstance(meta, TorchNativeMetadata)
        self.kvcache.store_kv(k, v, batch.out_loc, layer_id)
        heads = q.shape[1]
        k_all = self.kvcache.k_cache(layer_id).view(-1, *self.kvcache.k_cache(layer_id).shape[2:])
        v_all = self.kvcache.v_cache(layer_id).view(-1, *self.kvcache.v_cache(layer_id).shape[2:])
        # a padded key position points at whatever slot its page-table entry holds, maybe one
        # never written (NaN in fresh memory): a masked score does not protect against
        # 0 * NaN, so padded keys and values are zeroed
        valid = meta.kv_valid[:, :, None, None]
        keys = torch.where(valid, k_all[meta.kv_slots], 0).transpose(1, 2)  # [bs, kv_h, max_k, d]
        values = torch.where(valid, v_all[meta.kv_slots], 0).transpose(1, 2)
        # grouped-query attention: query head h reads key/value head h // group. On the CPU,
        # SDPA's enable_gqa computes the very numbers that repeated heads give, without the
        # copies; on a GPU it would run another kernel than transformers' attention does
        group = heads // keys.shape[1]
        on_cpu = q.device.type == "cpu"
        if group > 1 and not on_cpu:
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
        queries = q[meta.query_index].transpose(1, 2)  # [bs, heads, max_q, d]
        out = F.scaled_dot_product_attention(
            queries,
            keys.to(q.dtype),
            values.to(q.dtype),
            attn_mask=meta.mask,
            scale=self.scale,
            enable_gqa=on_cpu,
        )
        out = out.transpose(1, 2).flatten(0, 1)  # [bs * max_q, heads, d]
        return out[meta.out_index]  # the real queries' rows, in batch order

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        assert self.capture is None, "graphs are captured once"
        max_bs = max(bs_list)
        self.capture = TorchCaptureData.create(
            max_bs,
            max_seq_len,
            self.device,
            kv_valid=torch.zeros(max_bs, max_seq_len, dtype=torch.bool, device=self.device),
            rows=torch.arange(max_bs, device=self.device),
        )
        self.capture.kv_valid[:, 0] = True  # the capture batch: one key each, in slot 0
        self.capture_bs = sorted(bs_list)

    def prepare_for_capture(self, batch: Batch) -> None:
        bs, capture = batch.padded_size, self.capture
        assert capture is not None and bs in self.capture_bs
        kv_valid = capture.kv_valid[:bs]
        batch.attn_metadata = TorchNativeMetadata(
            cu_seqlens_q=capture.cu_seqlens_q[: bs + 1],
            query_index=capture.rows[:bs, None],
            out_index=capture.rows[:bs],
            kv_slots=capture.page_table[:bs],
            kv_valid=kv_valid,
            mask=kv_valid[:, None, None, :],  # one query per request, the last position
        )

    def prepare_for_replay(self, batch: Batch) -> None:
        meta, bs, capture = batch.attn_metadata, batch.padded_size, self.capture
        assert isinstance(meta, TorchNativeMetadata)
        assert capture is not None and bs in self.capture_bs
        width = meta.kv_slots.shape[1]
        capture.page_table[:bs, :width].copy_(meta.kv_slots)
        capture.kv_valid[:bs, width:].zero_()
        capture.kv_valid[:bs, :width].copy_(meta.kv_valid)
