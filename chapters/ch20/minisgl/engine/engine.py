"""The engine: one model on one device, with its KV pool, page table, attention backend and
sampler. It runs one batch at a time (forward_batch); deciding what goes into a batch is the
scheduler's job (chapter 07). With tensor parallelism (chapter 16) there is one engine per
rank, each holding its slice of the model, all running the same batches in step: the
collectives inside the layers keep them together."""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from typing import Any, Dict, NamedTuple, Tuple

import torch
import torch.distributed as dist

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, clear_global_ctx, set_global_ctx
from minisgl.distributed import destroy_distributed, reset_tp_info, set_tp_info
from minisgl.kvcache import create_kvcache_pool
from minisgl.layers import set_rope_device
from minisgl.models import create_model, load_weight
from minisgl.moe import create_moe_backend
from minisgl.utils import device as dev
from minisgl.utils import div_even, init_logger, torch_dtype

from .config import EngineConfig
from .graph import GraphRunner
from .sample import BatchSamplingArgs, Sampler

logger = init_logger(__name__)


class ForwardOutput(NamedTuple):
    next_tokens_gpu: torch.Tensor  # on the engine's device
    next_tokens_cpu: torch.Tensor  # a host copy, valid once copy_done_event has completed
    copy_done_event: dev.Event


def mem_GB(size: int) -> str:
    return f"{size / (1024**3):.2f} GiB"


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        set_tp_info(rank=config.tp_info.rank, size=config.tp_info.size)
        _adjust_config(config)

        self.device = dev.default_device(config.tp_info.rank)
        if dev.is_cuda(self.device):
            torch.cuda.set_device(self.device)
        torch.manual_seed(42)  # sampling is reproducible from one engine start to the next
        self.stream = dev.Stream(self.device)
        dev.set_stream(self.stream)
        self.dtype = config.dtype
        self.ctx = Context(config.page_size)
        set_global_ctx(self.ctx)
        self.tp_cpu_group = self._init_communication(config)
        free_before_model = self._free_memory()
        logger.info_rank0(f"free memory before loading the model: {mem_GB(free_before_model)}")

        # the model: built on the meta device (no memory), then filled with the real weights
        set_rope_device(self.device)
        with torch.device("meta"), torch_dtype(config.dtype):
            self.model = create_model(config.model_config)
        self.model.load_state_dict(self._load_weight_state_dict(config))

        # the KV pool, sized from what memory is left (or from num_page_override)
        self.num_pages = self._determine_num_pages(free_before_model, config)
        num_tokens = self.num_pages * config.page_size
        self.ctx.kv_cache = self.kv_cache = create_kvcache_pool(
            model_config=config.model_config,
            num_pages=self.num_pages + 1,  # one more: the dummy page (see dummy_req)
            page_size=config.page_size,
            device=self.device,
            dtype=self.dtype,
        )

        # the page table: one row per request slot (+1 for the dummy request), one column per
        # position, holding token slots; columns are padded to a multiple of 32 (128 bytes)
        self.max_seq_len = min(config.max_seq_len, num_tokens)
        aligned_max_seq_len = _align_up_32(self.max_seq_len)
        self.ctx.page_table = self.page_table = torch.zeros(
            (config.max_running_req + 1, aligned_max_seq_len), dtype=torch.int32, device=self.device
        )

        self.ctx.attn_backend = self.attn_backend = create_attention_backend(
            config.attention_backend, config.model_config
        )
        if config.model_config.is_moe:
            self.ctx.moe_backend = self.moe_backend = create_moe_backend(config.moe_backend)
        self.sampler = Sampler(self.device, config.model_config.vocab_size)

        # a request that pads batches (CUDA graphs, chapter 18); its K/V go to the dummy page
        self.dummy_req = Req(
            input_ids=torch.tensor([0], dtype=torch.int32, device="cpu"),
            table_idx=config.max_running_req,
            cached_len=0,
            output_len=1,
            uid=-1,
            sampling_params=None,  # type: ignore[arg-type]
            cache_handle=None,  # type: ignore[arg-type]
        )
        self.page_table[self.dummy_req.table_idx].fill_(num_tokens)
        self.graph_runner = GraphRunner(
            stream=self.stream,
            device=self.device,
            model=self.model,
            attn_backend=self.attn_backend,
            cuda_graph_bs=config.cuda_graph_bs,
            cuda_graph_max_bs=config.cuda_graph_max_bs,
            free_memory=free_before_model,
            max_seq_len=aligned_max_seq_len,
            vocab_size=config.model_config.vocab_size,
            dummy_req=self.dummy_req,
        )
        logger.info_rank0(f"free memory after initialisation: {mem_GB(self._free_memory())}")

    def _init_communication(self, config: EngineConfig) -> dist.ProcessGroup | None:
        """With several ranks, join their process group: gloo on the CPU; on GPUs NCCL for the
        layers' tensors, and a gloo group beside it for what the scheduler sends between ranks
        (CPU tensors). It returns the group for CPU tensors; with one rank, there is none."""
        tp_info = config.tp_info
        if tp_info.size == 1:
            return None
        on_gpu = dev.is_cuda(self.device)
        dist.init_process_group(
            backend="nccl" if on_gpu else "gloo",
            init_method=config.distributed_addr,
            rank=tp_info.rank,
            world_size=tp_info.size,
            timeout=timedelta(seconds=config.distributed_timeout),
        )
        group = dist.new_group(backend="gloo") if on_gpu else dist.group.WORLD
        assert group is not None
        logger.info_rank0(f"{tp_info.size} ranks joined ({'nccl' if on_gpu else 'gloo'})")
        return group

    def _free_memory(self) -> int:
        dev.synchronize(self.device)
        dev.empty_cache(self.device)
        return dev.free_memory(self.device)

    def _load_weight_state_dict(self, config: EngineConfig) -> Dict[str, torch.Tensor]:
        if config.use_dummy_weight:
            return {
                name: torch.randn(t.shape, dtype=self.dtype, device=self.device) * 0.02
                for name, t in self.model.state_dict().items()
            }
        return {
            name: tensor.to(self.dtype)
            for name, tensor in load_weight(config.model_path, self.device)
        }

    def _determine_num_pages(self, free_before_model: int, config: EngineConfig) -> int:
        model_config = config.model_config
        cache_per_page = (
            2  # key and value
            * model_config.head_dim
            * div_even(model_config.num_kv_heads, config.tp_info.size, allow_replicate=True)
            * config.page_size
            * self.dtype.itemsize
            * model_config.num_layers
        )
        num_pages, why = config.num_page_override, "num_page_override"
        if num_pages is None:
            free_after_model = self._free_memory()
            model_memory = max(free_before_model - free_after_model, 0)
            available = int(config.memory_ratio * free_before_model) - model_memory
            why = f"memory_ratio={config.memory_ratio} of the free memory, less the model"
            if not dev.is_cuda(self.device):
                available, why = _cpu_pool_bytes(available, why, config, cache_per_page)
            num_pages = available // cache_per_page
        if self.tp_cpu_group is not None:  # every rank must hold the same pages
            agreed = torch.tensor([num_pages], dtype=torch.int64)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self.tp_cpu_group)
            num_pages = int(agreed.item())
        assert num_pages > 1, "not enough memory for the KV cache: lower num_page_override"
        logger.info_rank0(
            f"KV cache: {num_pages * config.page_size} tokens in {num_pages} pages of "
            f"{config.page_size}, K + V = {mem_GB(num_pages * cache_per_page)} ({why})"
        )
        return num_pages

    def forward_batch(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        """Run a prepared batch (its metadata too), advance its requests, sample a token each.
        A decode batch padded to a captured size replays its CUDA graph."""
        if self.graph_runner.can_use_cuda_graph(batch):
            logits = self.graph_runner.replay(batch)
        else:
            with self.ctx.forward_batch(batch):
                logits = self.model.forward()
        for req in batch.reqs:
            req.complete_one()
        next_tokens_gpu = self.sampler.sample(logits[: batch.size], args).to(torch.int32)
        next_tokens_cpu = next_tokens_gpu.to("cpu", non_blocking=dev.is_cuda(self.device))
        copy_done_event = dev.Event(self.device)
        copy_done_event.record(self.stream)
        return ForwardOutput(next_tokens_gpu, next_tokens_cpu, copy_done_event)

    def shutdown(self) -> None:
        """Release the global state, so that another engine can start in this process."""
        dev.synchronize(self.device)
        self.graph_runner.destroy_cuda_graphs()
        if self.tp_cpu_group is not None:
            dist.destroy_process_group()
            destroy_distributed()
        clear_global_ctx()
        reset_tp_info()


CPU_MEMORY_SHARE = 0.25  # the most of a CPU machine's RAM that the KV pool takes by default


def _cpu_pool_bytes(
    available: int, why: str, config: EngineConfig, cache_per_page: int
) -> Tuple[int, str]:
    """On a CPU, the KV pool's default size leaves the machine usable: the smallest of what
    memory_ratio allows, CPU_MEMORY_SHARE of the RAM, and what every request slot needs at
    the longest sequence (a GPU's memory is the engine's alone; a laptop's RAM is not)."""
    per_token = cache_per_page // config.page_size
    share = int(CPU_MEMORY_SHARE * dev.total_memory(torch.device("cpu")))
    needed = config.max_running_req * config.max_seq_len * per_token + cache_per_page
    choices = [
        (available, why),
        (
            share,
            f"{CPU_MEMORY_SHARE:.0%} of this machine's {mem_GB(share / CPU_MEMORY_SHARE)} of RAM",
        ),
        (needed, f"{config.max_running_req} requests of {config.max_seq_len} tokens"),
    ]
    return min(choices)


def _align_up_32(num: int) -> int:
    return (num + 31) // 32 * 32


def _adjust_config(config: EngineConfig) -> None:
    def override(attr: str, value: Any) -> None:  # the config is frozen: use with care
        object.__setattr__(config, attr, value)

    if config.attention_backend == "auto":
        override("attention_backend", _auto_attention_backend(config))
        logger.info_rank0(f"attention backend: {config.attention_backend}")
    if config.model_config.is_moe and config.moe_backend == "auto":
        # the Triton kernels on a GPU; on a CPU the loop over the experts (Triton runs there
        # only in its interpreter, hundreds of times slower)
        on_gpu = dev.is_cuda(dev.default_device(config.tp_info.rank))
        override("moe_backend", "fused" if on_gpu else "torch")
        logger.info_rank0(f"MoE backend: {config.moe_backend}")


def _auto_attention_backend(config: EngineConfig) -> str:
    """FlashInfer where it runs: on a GPU, in a 16-bit type, installed. Else the torch backend,
    the only one with float32 kernels."""
    on_gpu = dev.is_cuda(dev.default_device(config.tp_info.rank))
    half = config.dtype in (torch.float16, torch.bfloat16)
    return "fi" if on_gpu and half and importlib.util.find_spec("flashinfer") else "torch"
