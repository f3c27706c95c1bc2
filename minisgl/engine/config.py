"""What an Engine is built from."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, List

import torch

from minisgl.distributed import DistributedInfo
from minisgl.utils import cached_load_hf_config

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from minisgl.models import ModelConfig


@dataclass(frozen=True)
class EngineConfig:
    model_path: str  # a local folder or a Hugging Face model id
    tp_info: DistributedInfo
    dtype: torch.dtype
    max_running_req: int = 256  # rows of the page table: requests that can be in flight
    attention_backend: str = "auto"  # a registered name, "prefill,decode", or "auto"
    moe_backend: str = "auto"  # used from chapter 20
    cuda_graph_bs: List[int] | None = None  # used from chapter 18
    cuda_graph_max_bs: int | None = None  # used from chapter 18
    page_size: int = 1
    memory_ratio: float = 0.9  # share of free memory (device or RAM) the engine may use
    distributed_timeout: float = 60.0  # used from chapter 16
    use_dummy_weight: bool = False  # random weights of the right shapes (for benchmarks)
    use_pynccl: bool = True  # used from chapter 16
    max_seq_len_override: int | None = None
    num_page_override: int | None = None  # the KV pool's size in pages, instead of memory_ratio

    @cached_property
    def hf_config(self) -> PretrainedConfig:
        return cached_load_hf_config(self.model_path)

    @cached_property
    def model_config(self) -> ModelConfig:
        from minisgl.models import ModelConfig

        return ModelConfig.from_hf(self.hf_config)

    @property
    def max_seq_len(self) -> int:
        if self.max_seq_len_override is not None:
            return self.max_seq_len_override
        return self.model_config.rotary_config.max_position

    @property
    def max_forward_len(self) -> int:
        return self.max_seq_len

    @property
    def distributed_addr(self) -> str:
        return "tcp://127.0.0.1:2333"
