"""FlashInfer attention (registered as "fi").

FlashInfer splits attention in two calls. `plan` gets the batch's shape (how many query and key
tokens each request has, which KV slots hold its keys, the head counts) and prepares the work:
it copies the indices to the GPU and decides how to split the keys among the thread blocks.
`run` then does the arithmetic for one layer. A batch plans once and runs once per layer, so
the planning is paid once for the whole model.

The engine's page table holds one KV slot per position (chapter 04). FlashInfer is told that a
page holds one token: the pool is viewed as [slots, 1, kv_heads, head_dim] and a request's
"pages" are simply its slots, whatever page size the engine allocates with.

For CUDA graphs (chapter 18) FlashInfer has a decode wrapper whose offsets, indices and last
page lengths live in buffers given to it once: its `plan` copies a batch's values into them,
and the kernels captured in the graph read them there. One such wrapper per captured size.

Project P1: a decode batch whose query heads share a key/value head in groups of fewer than 4
(where FlashInfer's plain decode kernel would run) runs the book's Triton kernel of equal
chunks instead (kernel/triton/decode_attention.py), unless MINISGL_TRITON_DECODE=0. It reads
the offsets and indices that FlashInfer's plan has put on the GPU, in the graphs' buffers too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Dict, List, Literal, Union

import torch

from minisgl.core import Batch, get_global_ctx
from minisgl.distributed import tp_info_or_one
from minisgl.env import ENV
from minisgl.utils import device as dev
from minisgl.utils import div_even, init_logger

from .base import BaseAttnBackend, BaseAttnMetadata
from .utils import BaseCaptureData

if TYPE_CHECKING:
    from flashinfer import (
        BatchDecodeWithPagedKVCacheWrapper,
        BatchPrefillWithPagedKVCacheWrapper,
        CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    )

    from minisgl.models import ModelConfig

logger = init_logger(__name__)
FlashInferWrapper = Union[
    "BatchPrefillWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper"
]

# measured best at the offline workload's shapes (tools/bench_p1.py decode-kernels): the pieces
# on the H200; heads_first and merge_warps=1 on the H100 (3.1% on the workload), not yet on the
# H200. page_runs: with pages of block_n slots or more, one index per block_n keys; tma (with
# page runs): the keys and values by Hopper's bulk copies (slower on both GPUs); narrow_parts:
# the pieces' results in the output's dtype for the merge, not in float32 (slower on both)
TRITON_DECODE_SETTINGS = dict(
    splits=8, chunk=256, block_n=64, num_warps=4, num_stages=3, equal=False, merge_here=False,
    page_runs=True, tma=False, narrow_parts=False, page_loop=False, heads_first=True,
    max_registers=0, merge_warps=1,
)  # fmt: skip
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's advice for its split-K scratch space
INT_WORKSPACE_BYTES = 8 * 1024 * 1024  # what a FlashInfer wrapper allocates for its plan


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << math.ceil(math.log2(n))


@dataclass
class FICaptureData(BaseCaptureData):
    """FlashInfer's names for the buffers: with pages of one slot, each request's last page
    holds one token (a buffer of ones: the sequence lengths at allocation, never written
    again), and the page table, flattened, holds the ragged indices."""

    @property
    def one_tensor(self) -> torch.Tensor:
        return self.seq_lens

    @property
    def indices(self) -> torch.Tensor:
        return self.page_table


@dataclass
class FIMetadata(BaseAttnMetadata):
    # fmt: off
    cu_seqlens_q_cpu:   torch.Tensor  # [bs + 1] int32, host: offsets of each request's queries
    cu_seqlens_k_cpu:   torch.Tensor  # [bs + 1] int32, host: offsets of each request's keys
    cu_seqlens_q_gpu:   torch.Tensor  # the same as cu_seqlens_q_cpu, on the engine's device
    indices:            torch.Tensor  # [total keys] int32, device: the KV slot of every key
    last_page_len_cpu:  torch.Tensor  # [bs] int32, host: all ones (a page is one token)
    num_qo_heads:       int           # this rank's query heads
    num_kv_heads:       int           # this rank's key/value heads
    head_dim:           int
    page_size:          Literal[1]
    pos_encoding_mode:  str           # "NONE": RoPE was applied before attention
    seq_lens_cpu:       torch.Tensor  # [bs] int32, host: each request's number of keys
    dtype:              torch.dtype
    wrapper:            FlashInferWrapper
    initialized:        bool = False  # planned yet (at the first layer's forward)
    # fmt: on

    def __post_init__(self) -> None:
        assert self.page_size == 1, "the engine's page table is per token: pages of one slot"
        host = (self.cu_seqlens_q_cpu, self.cu_seqlens_k_cpu, self.last_page_len_cpu)
        assert all(t.is_cpu for t in (*host, self.seq_lens_cpu)), "plan reads these on the host"
        assert self.indices.device == self.cu_seqlens_q_gpu.device

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.cu_seqlens_q_gpu[1 : 1 + bs] - 1


class FlashInferBackend(BaseAttnBackend):
    def __init__(self, config: ModelConfig) -> None:
        try:
            from flashinfer import (
                BatchDecodeWithPagedKVCacheWrapper,
                BatchPrefillWithPagedKVCacheWrapper,
            )
        except ImportError as e:
            raise ImportError(
                "the 'fi' attention backend needs FlashInfer (pip install flashinfer-python, "
                "with an NVIDIA GPU); elsewhere use --attention-backend torch"
            ) from e

        self.config = config
        self.kvcache = get_global_ctx().kv_cache
        self.device = self.kvcache.device
        # one scratch space for both wrappers: a batch is either prefill or decode
        self.float_workspace_buffer = torch.empty(
            WORKSPACE_BYTES, dtype=torch.uint8, device=self.device
        )
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            self.float_workspace_buffer, kv_layout="NHD", backend="fa2"
        )
        self.decode_wrappers = BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace_buffer,
            kv_layout="NHD",
            use_tensor_cores=self.use_tensor_cores,
            backend="fa2",
        )
        tp_size = tp_info_or_one().size
        self.qo_head_local = div_even(config.num_qo_heads, tp_size)
        self.kv_head_local = div_even(config.num_kv_heads, tp_size, allow_replicate=True)
        self.cached_ones_cpu = torch.ones(0, dtype=torch.int32)
        # CUDA graphs (chapter 18): one decode wrapper per captured batch size
        self.capture: FICaptureData | None = None
        self.capture_bs: List[int] = []
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        # plan() stages its indices in a host buffer and copies them to the GPU without
        # waiting; the next plan must not overwrite that buffer before the copy is done
        self.last_event = dev.Event(self.device)
        self.last_event.record()

    @cached_property
    def use_tensor_cores(self) -> bool:
        """Decode on tensor cores (FlashInfer's prefill kernel) when at least 4 query heads
        share a key/value head: the shared keys then make a small matrix product worth the
        tensor cores; with fewer, the plain decode kernel is faster."""
        return self.config.num_qo_heads // self.config.num_kv_heads >= 4

    @cached_property
    def triton_decode(self) -> bool:
        """Project P1: decode with the Triton kernel of equal chunks, on a GPU, wherever
        FlashInfer's plain decode kernel would run (MINISGL_TRITON_DECODE=0: never)."""
        return bool(ENV.TRITON_DECODE) and self.device.type == "cuda" and not self.use_tensor_cores

    @cached_property
    def triton_decode_settings(self) -> Dict[str, int]:
        """The kernel's settings: TRITON_DECODE_SETTINGS and MINISGL_TRITON_PDL, then
        MINISGL_TRITON_DECODE_SETTINGS; the engine's page size where page_runs is on."""
        settings = {**TRITON_DECODE_SETTINGS, "pdl": bool(ENV.TRITON_PDL)}
        settings.update(ENV.TRITON_DECODE_SETTINGS.value)
        settings["page_size"] = get_global_ctx().page_size if settings.pop("page_runs") else 1
        return settings

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.padded_reqs
        seqlens_q = [r.extend_len for r in reqs]
        seqlens_k = [r.device_len for r in reqs]
        host = dict(dtype=torch.int32, device="cpu", pin_memory=dev.pin_memory(self.device))
        cu_seqlens_k_cpu = torch.tensor([0] + seqlens_k, **host).cumsum_(dim=0)  # type: ignore[arg-type]
        if max(seqlens_q) == 1:  # decode: one query per request
            cu_seqlens_q_cpu = torch.arange(0, len(reqs) + 1, **host)  # type: ignore[arg-type]
        elif all(r.cached_len == 0 for r in reqs):  # prefill of whole prompts: as many as keys
            cu_seqlens_q_cpu = cu_seqlens_k_cpu
        else:  # prefill after a cached prefix, or a later chunk
            cu_seqlens_q_cpu = torch.tensor([0] + seqlens_q, **host).cumsum_(dim=0)  # type: ignore[arg-type]
        page_table = get_global_ctx().page_table
        batch.attn_metadata = FIMetadata(
            cu_seqlens_q_cpu=cu_seqlens_q_cpu,
            cu_seqlens_k_cpu=cu_seqlens_k_cpu,
            cu_seqlens_q_gpu=dev.to_device(cu_seqlens_q_cpu, self.device),
            indices=gather_key_slots(page_table, [r.table_idx for r in reqs], seqlens_k),
            last_page_len_cpu=self._get_ones_cpu(len(reqs)),
            num_qo_heads=self.qo_head_local,
            num_kv_heads=self.kv_head_local,
            head_dim=self.config.head_dim,
            page_size=1,
            pos_encoding_mode="NONE",
            seq_lens_cpu=torch.tensor(seqlens_k, **host),  # type: ignore[arg-type]
            dtype=self.kvcache.dtype,
            wrapper=self.decode_wrappers if batch.is_decode else self.prefill_wrapper,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer_id: int,
        batch: Batch,
    ) -> torch.Tensor:
        metadata = batch.attn_metadata
        assert isinstance(metadata, FIMetadata)
        self._initialize_metadata_once(metadata)
        if k is not None and v is not None:  # else the layer stored them (P1)
            self.kvcache.store_kv(k, v, batch.out_loc, layer_id)
        k_cache, v_cache = self.kvcache.k_cache(layer_id), self.kvcache.v_cache(layer_id)
        if self.triton_decode and _is_decode(metadata.wrapper):
            from minisgl.kernel.triton.decode_attention import decode_attention_triton

            # the offsets and slots that plan copied to the GPU (the graphs' buffers in a graph)
            indptr, indices = (
                metadata.wrapper._paged_kv_indptr_buf,
                metadata.wrapper._paged_kv_indices_buf,
            )
            return decode_attention_triton(
                q, _slots(k_cache), _slots(v_cache), indptr, indices, **self.triton_decode_settings
            )
        return metadata.wrapper.run(
            q=q, paged_kv_cache=(_one_slot_pages(k_cache), _one_slot_pages(v_cache))
        )

    def _initialize_metadata_once(self, metadata: FIMetadata) -> None:
        """Plan at the first layer's forward, not in prepare_metadata: with overlap scheduling
        the next batch is prepared while this one still runs on the GPU, and planning then
        would overwrite the host buffer of a copy that may not have happened yet."""
        if metadata.initialized:
            return
        metadata.initialized = True
        self.last_event.synchronize()
        if _is_decode(metadata.wrapper):
            metadata.wrapper.plan(
                indptr=metadata.cu_seqlens_k_cpu,
                indices=metadata.indices,
                last_page_len=metadata.last_page_len_cpu,
                num_qo_heads=metadata.num_qo_heads,
                num_kv_heads=metadata.num_kv_heads,
                head_dim=metadata.head_dim,
                page_size=metadata.page_size,
                pos_encoding_mode=metadata.pos_encoding_mode,
                seq_lens=metadata.seq_lens_cpu,
                q_data_type=metadata.dtype,
                kv_data_type=metadata.dtype,
                non_blocking=True,
            )
        else:
            metadata.wrapper.plan(
                qo_indptr=metadata.cu_seqlens_q_cpu,
                paged_kv_indptr=metadata.cu_seqlens_k_cpu,
                paged_kv_indices=metadata.indices,
                paged_kv_last_page_len=metadata.last_page_len_cpu,
                num_qo_heads=metadata.num_qo_heads,
                num_kv_heads=metadata.num_kv_heads,
                head_dim_qk=metadata.head_dim,
                page_size=metadata.page_size,
                pos_encoding_mode=metadata.pos_encoding_mode,
                seq_lens=metadata.seq_lens_cpu,
                q_data_type=metadata.dtype,
                kv_data_type=metadata.dtype,
                non_blocking=True,
                causal=True,
            )
        self.last_event.record()

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        assert self.capture is None, "graphs are captured once"
        capture = FICaptureData.create(max(bs_list), max_seq_len, self.device)
        capture.page_table = capture.page_table.view(-1)  # the ragged indices, one after another
        self.capture = capture
        self.capture_bs = sorted(bs_list)
        self.int_workspace_buffer = torch.empty(
            INT_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device
        )

    def prepare_for_capture(self, batch: Batch) -> None:
        from flashinfer import CUDAGraphBatchDecodeWithPagedKVCacheWrapper

        bs, capture = batch.padded_size, self.capture
        assert capture is not None and bs in self.capture_bs and bs not in self.graph_wrappers
        wrapper = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace_buffer,
            kv_layout="NHD",
            use_tensor_cores=self.use_tensor_cores,
            indptr_buffer=capture.cu_seqlens_k[: bs + 1],
            indices_buffer=capture.indices,
            last_page_len_buffer=capture.one_tensor[:bs],
        )
        # as the other wrappers: FlashInfer's FA2 kernels (the constructor takes no backend)
        wrapper._backend = "fa2"
        # a wrapper makes its own 8 MiB for its plan; the graphs' plans are used one at a time
        wrapper._int_workspace_buffer = self.int_workspace_buffer
        self.graph_wrappers[bs] = wrapper
        self.prepare_metadata(batch)
        metadata = batch.attn_metadata
        assert isinstance(metadata, FIMetadata)
        metadata.wrapper = wrapper
        self._initialize_metadata_once(metadata)  # planned before the capture, not inside it

    def prepare_for_replay(self, batch: Batch) -> None:
        metadata, bs = batch.attn_metadata, batch.padded_size
        assert isinstance(metadata, FIMetadata) and not metadata.initialized
        assert bs in self.graph_wrappers
        metadata.wrapper = self.graph_wrappers[bs]
        self._initialize_metadata_once(metadata)  # plan: copies into the wrapper's buffers

    def _get_ones_cpu(self, bs: int) -> torch.Tensor:
        """bs ones (every request's last page holds its one token), from a buffer that grows
        by powers of two, so most batches allocate nothing."""
        if bs > len(self.cached_ones_cpu):
            pinned = dev.pin_memory(self.device)
            self.cached_ones_cpu = torch.ones(
                _next_power_of_2(bs), dtype=torch.int32, pin_memory=pinned
            )
        return self.cached_ones_cpu[:bs]


def gather_key_slots(page_table: torch.Tensor, rows: List[int], lengths: List[int]) -> torch.Tensor:
    """page_table[rows[i], :lengths[i]] for every i, one after another: the KV slot of every
    key of the batch. A fixed handful of kernels whatever the batch size, where a slice per
    request and a cat cost the host a few microseconds per request; nothing waits for the
    device (the output's length is known on the host)."""
    device, total = page_table.device, sum(lengths)
    rows_and_lengths = dev.host_tensor(rows + lengths, torch.int64, device)
    rows_gpu, lengths_gpu = dev.to_device(rows_and_lengths, device).split(len(rows))
    row_of_key = torch.repeat_interleave(rows_gpu, lengths_gpu, output_size=total)
    starts = torch.cumsum(lengths_gpu, dim=0) - lengths_gpu  # where each request's keys begin
    start_of_key = torch.repeat_interleave(starts, lengths_gpu, output_size=total)
    position = torch.arange(total, device=device) - start_of_key
    return page_table[row_of_key, position]


def _is_decode(wrapper: FlashInferWrapper) -> bool:
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper

    return isinstance(wrapper, BatchDecodeWithPagedKVCacheWrapper)


def _slots(cache: torch.Tensor) -> torch.Tensor:
    """[pages, page_size, kv_heads, head_dim] viewed as [slots, kv_heads, head_dim]."""
    return cache.view(-1, cache.shape[2], cache.shape[3])


def _one_slot_pages(cache: torch.Tensor) -> torch.Tensor:
    """[pages, page_size, kv_heads, head_dim] viewed as pages of one slot each."""
    return cache.view(-1, 1, cache.shape[2], cache.shape[3])
