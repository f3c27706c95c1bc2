"""CUDA graphs for the decode step.

A decode step of a small model is hundreds of short kernels, each launched from Python; at a
small batch the GPU finishes them faster than the host can launch them. A CUDA graph records
the launches of one step once and replays them with a single call. The price is that a graph
is frozen: the same kernels on the same addresses with the same shapes. So:

* one graph per batch size, captured at start-up for a list of sizes; a decode batch is padded
  with a dummy request up to the next captured size;
* the step reads its inputs (token ids, positions, KV slots to write) from fixed buffers, and
  replay first copies the batch's inputs into them; the logits come out in a fixed buffer too;
* the attention backend keeps its metadata in fixed buffers as well (`init_capture_graph`,
  `prepare_for_capture`), and refreshes them before each replay (`prepare_for_replay`).

Prefill batches (and decode batches larger than the largest graph) run eagerly.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List

import torch

from minisgl.core import Batch, Req, get_global_ctx
from minisgl.utils import device as dev
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.attention import BaseAttnBackend
    from minisgl.models import BaseLLMModel

logger = init_logger(__name__)

GPU_LARGE_GB = 80  # above this much free memory (an H100, an H200), graphs up to batch 256


@dataclass
class GraphCaptureBuffer:
    """The step's inputs and output, at the largest graph's batch size; a graph of batch size
    bs uses their first bs rows."""

    input_ids: torch.Tensor  # [max_bs] int32
    out_loc: torch.Tensor  # [max_bs] int32: the KV slot each new token is written to
    positions: torch.Tensor  # [max_bs] int32
    logits: torch.Tensor  # [max_bs, vocab] float32

    @classmethod
    def init(cls, bs: int, vocab_size: int, device: torch.device) -> GraphCaptureBuffer:
        def ints() -> torch.Tensor:
            return torch.zeros(bs, dtype=torch.int32, device=device)

        logits = torch.empty(bs, vocab_size, dtype=torch.float32, device=device)
        return cls(input_ids=ints(), out_loc=ints(), positions=ints(), logits=logits)

    def set_batch(self, batch: Batch) -> None:
        """Make the capture batch read its inputs from the buffers."""
        rows = slice(batch.padded_size)
        batch.input_ids = self.input_ids[rows]
        batch.out_loc = self.out_loc[rows]
        batch.positions = self.positions[rows]

    def copy_from(self, batch: Batch) -> None:
        """Put a batch's inputs where the graph reads them."""
        rows = slice(batch.padded_size)
        self.input_ids[rows].copy_(batch.input_ids)
        self.out_loc[rows].copy_(batch.out_loc)
        self.positions[rows].copy_(batch.positions)


def _determine_cuda_graph_bs(
    cuda_graph_bs: List[int] | None,
    cuda_graph_max_bs: int | None,
    free_memory: int,
    device: torch.device,
) -> List[int]:
    """The batch sizes to capture: as given; else 1, 2, 4 and every multiple of 8 up to the
    largest (256 on a GPU with more than GPU_LARGE_GB free, else 160). On the CPU graphs save
    nothing (nothing is launched), so there they are captured only when asked for."""
    if cuda_graph_bs is not None:
        return sorted(set(cuda_graph_bs))
    if cuda_graph_max_bs is None:
        if not dev.is_cuda(device):
            return []
        cuda_graph_max_bs = 256 if free_memory / (1 << 30) > GPU_LARGE_GB else 160
    sizes = [1, 2, 4, *range(8, cuda_graph_max_bs + 1, 8)]
    return [bs for bs in sizes if bs <= cuda_graph_max_bs]


def mem_GB(size: int) -> str:
    return f"{size / (1024**3):.2f} GiB"


class GraphRunner:
    def __init__(
        self,
        stream: dev.Stream,
        device: torch.device,
        model: BaseLLMModel,
        attn_backend: BaseAttnBackend,
        cuda_graph_bs: List[int] | None,
        cuda_graph_max_bs: int | None,
        free_memory: int,
        max_seq_len: int,
        vocab_size: int,
        dummy_req: Req,
    ) -> None:
        self.graph_bs_list = _determine_cuda_graph_bs(
            cuda_graph_bs, cuda_graph_max_bs, free_memory, device
        )
        self.max_graph_bs = max(self.graph_bs_list, default=0)
        self.attn_backend = attn_backend
        self.dummy_req = dummy_req
        self.stream = stream
        self.device = device
        self.graph_map: Dict[int, dev.Graph] = {}
        self._capture_graphs(max_seq_len, vocab_size, model)

    def _capture_graphs(self, max_seq_len: int, vocab_size: int, model: BaseLLMModel) -> None:
        if self.max_graph_bs == 0:
            logger.info_rank0("CUDA graphs: off")
            return
        self.attn_backend.init_capture_graph(max_seq_len=max_seq_len, bs_list=self.graph_bs_list)
        self.buffer = GraphCaptureBuffer.init(self.max_graph_bs, vocab_size, self.device)
        dev.synchronize(self.device)
        free_before = dev.free_memory(self.device)
        pool = None
        # the largest first: the smaller graphs then fit in the memory it already holds
        for bs in sorted(self.graph_bs_list, reverse=True):
            batch = Batch(reqs=[self.dummy_req] * bs, phase="decode")
            batch.padded_reqs = batch.reqs
            self.attn_backend.prepare_for_capture(batch)
            self.buffer.set_batch(batch)

            def step(batch: Batch = batch, bs: int = bs) -> None:
                with get_global_ctx().forward_batch(batch):
                    self.buffer.logits[:bs] = model.forward()

            step()  # once eagerly: lazy initialisations must not happen inside the capture
            graph = dev.Graph(self.device)
            graph.capture(step, self.stream, pool)
            pool = pool if pool is not None else graph.pool()
            self.graph_map[bs] = graph
        dev.synchronize(self.device)
        used = max(free_before - dev.free_memory(self.device), 0)
        logger.info_rank0(
            f"CUDA graphs: captured batch sizes {self.graph_bs_list} "
            f"({mem_GB(used) if dev.is_cuda(self.device) else 'emulated on the CPU'})"
        )

    def can_use_cuda_graph(self, batch: Batch) -> bool:
        return batch.is_decode and batch.size <= self.max_graph_bs

    def pad_batch(self, batch: Batch) -> None:
        """Pad a decode batch with the dummy request up to the smallest captured size that
        holds it; any other batch runs as it is."""
        size = batch.size
        if self.can_use_cuda_graph(batch):
            size = next(bs for bs in self.graph_bs_list if bs >= batch.size)
        batch.padded_reqs = batch.reqs + [self.dummy_req] * (size - batch.size)

    def replay(self, batch: Batch) -> torch.Tensor:
        """Run a prepared decode batch through its graph; the logits of its real requests."""
        assert self.can_use_cuda_graph(batch) and batch.padded_size in self.graph_map
        self.buffer.copy_from(batch)
        self.attn_backend.prepare_for_replay(batch)
        self.graph_map[batch.padded_size].replay()
        return self.buffer.logits[: batch.size]

    def destroy_cuda_graphs(self) -> None:
        """Free the graphs (before the process group goes: a graph may hold NCCL work)."""
        self.graph_map.clear()
        gc.collect()
