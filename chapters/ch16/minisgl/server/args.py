"""The server's settings: `ServerArgs` (a SchedulerConfig with the server's own fields and
addresses) and `parse_args`, the command line of `python -m minisgl`."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import List, Tuple

import torch

from minisgl.distributed import DistributedInfo
from minisgl.scheduler import SchedulerConfig
from minisgl.utils import device as dev
from minisgl.utils import init_logger


@dataclass(frozen=True)
class ServerArgs(SchedulerConfig):
    server_host: str = "127.0.0.1"
    server_port: int = 1919
    num_tokenizer: int = 0  # 0: one worker both tokenizes and detokenizes
    silent_output: bool = False

    @property
    def share_tokenizer(self) -> bool:
        return self.num_tokenizer == 0

    @property
    def zmq_frontend_addr(self) -> str:
        """Where the API server receives the text pieces."""
        return self._ipc_addr("frontend")

    @property
    def zmq_tokenizer_addr(self) -> str:
        """Where the tokenizers receive the prompts (the detokenizer's, when shared)."""
        return self.zmq_detokenizer_addr if self.share_tokenizer else self._ipc_addr("tokenizer")

    def zmq_tokenizer_addr_of(self, index: int) -> str:
        """Tokenizer `index`'s own address: the API server sends each request's messages to
        one tokenizer, chosen by its uid, so that they stay in order."""
        return (
            self.zmq_tokenizer_addr
            if self.share_tokenizer
            else f"{self.zmq_tokenizer_addr}-{index}"
        )

    @property
    def tokenizer_create_addr(self) -> bool:
        return True  # each tokenizer binds its own address

    @property
    def backend_create_detokenizer_link(self) -> bool:
        return False  # the detokenizer binds it; the scheduler connects

    @property
    def frontend_create_tokenizer_link(self) -> bool:
        return False  # the tokenizers bind their addresses; the API server connects


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], not {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be a port number (1 to 65535), not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from minisgl.attention import SUPPORTED_ATTENTION_BACKENDS, validate_attn_backend
    from minisgl.kvcache import SUPPORTED_CACHE_MANAGER

    d = ServerArgs  # the defaults
    p = argparse.ArgumentParser(
        prog="python -m minisgl",
        description="Serve a model with an OpenAI-compatible HTTP API (or a chat in the "
        "terminal with --shell-mode).",
    )
    add = p.add_argument
    add(
        "--model-path",
        "--model",
        required=True,
        help="a local folder of safetensors weights, or a Hugging Face model id",
    )
    add(
        "--dtype",
        default="auto",
        choices=["auto", "float16", "bfloat16", "float32"],
        help="weights and activations; auto: float32 on a CPU, the checkpoint's dtype on a GPU",
    )
    add(
        "--tensor-parallel-size",
        "--tp-size",
        type=_positive,
        default=1,
        help="ranks to shard the model over: one GPU each, or one CPU process each without GPUs",
    )
    add(
        "--max-running-requests",
        dest="max_running_req",
        type=_positive,
        default=d.max_running_req,
        help="requests that may run at once (rows of the page table)",
    )
    add(
        "--max-seq-len-override",
        type=_positive,
        default=d.max_seq_len_override,
        help="the longest sequence (prompt and output), instead of the model's",
    )
    add(
        "--memory-ratio",
        type=_ratio,
        default=d.memory_ratio,
        help="share of the free memory for the KV cache (on a CPU also at most a quarter of "
        "the RAM)",
    )
    add(
        "--dummy-weight",
        dest="use_dummy_weight",
        action="store_true",
        help="random weights of the right shapes, for benchmarks",
    )
    add("--host", dest="server_host", default=d.server_host, help="the address to listen on")
    add(
        "--port",
        dest="server_port",
        type=_port,
        default=d.server_port,
        help="the port to listen on",
    )
    add(
        "--cuda-graph-max-bs",
        "--graph",
        type=int,
        default=d.cuda_graph_max_bs,
        help="the largest batch captured in a CUDA graph (chapter 18)",
    )
    add(
        "--num-tokenizer",
        "--tokenizer-count",
        type=int,
        default=d.num_tokenizer,
        help="tokenizer processes; 0: one process tokenizes and detokenizes",
    )
    add(
        "--max-prefill-length",
        "--max-extend-length",
        dest="max_extend_tokens",
        type=_positive,
        default=d.max_extend_tokens,
        help="the most prompt tokens a prefill batch computes (longer prompts are chunked)",
    )
    add(
        "--num-pages",
        dest="num_page_override",
        type=_positive,
        default=d.num_page_override,
        help="the KV cache's size in pages, instead of --memory-ratio",
    )
    add("--page-size", type=_positive, default=d.page_size, help="tokens per KV page")
    add(
        "--attention-backend",
        "--attn",
        type=validate_attn_backend,
        default=d.attention_backend,
        help="a backend, or 'prefill,decode' for two; auto picks one (registered: "
        f"{', '.join(SUPPORTED_ATTENTION_BACKENDS.supported_names())})",
    )
    add(
        "--cache-type",
        default=d.cache_type,
        choices=SUPPORTED_CACHE_MANAGER.supported_names(),
        help="the prefix cache",
    )
    add("--shell-mode", action="store_true", help="chat in this terminal instead of serving HTTP")
    return p


def parse_args(args: List[str], run_shell: bool = False) -> Tuple[ServerArgs, bool]:
    """ServerArgs from a command line, and whether to run the shell instead of HTTP."""
    parser = build_parser()
    kwargs = vars(parser.parse_args(args)).copy()
    run_shell |= kwargs.pop("shell_mode")
    if run_shell:  # one conversation at a time, and no log lines between the answers
        kwargs.update(max_running_req=1, cuda_graph_max_bs=1, silent_output=True)
    kwargs["model_path"] = os.path.expanduser(kwargs["model_path"])
    tp_size = kwargs.pop("tensor_parallel_size")
    problem = _tp_problem(tp_size, kwargs["model_path"])
    if problem:
        parser.error(f"--tp-size {tp_size}: {problem}")
    if kwargs["num_tokenizer"] < 0:
        parser.error(f"--num-tokenizer must be 0 or more, not {kwargs['num_tokenizer']}")
    kwargs["tp_info"] = DistributedInfo(0, tp_size)
    kwargs["dtype"] = _resolve_dtype(kwargs["dtype"], kwargs["model_path"])
    result = ServerArgs(**kwargs)
    init_logger(__name__).info(f"server arguments: {result}")
    return result, run_shell


def _tp_problem(tp_size: int, model_path: str) -> str | None:
    """Why `tp_size` ranks cannot share this model (None: they can)."""
    if tp_size == 1:
        return None
    on_gpu = dev.is_cuda(dev.default_device())  # not with MINISGL_DEVICE=cpu
    if on_gpu and torch.cuda.device_count() < tp_size:
        return f"this machine has {torch.cuda.device_count()} GPU(s), one per rank is needed"
    from minisgl.models import ModelConfig
    from minisgl.utils import cached_load_hf_config

    config = ModelConfig.from_hf(cached_load_hf_config(model_path))
    kv = config.num_kv_heads
    if config.num_qo_heads % tp_size:
        return f"the model's {config.num_qo_heads} attention heads do not split into {tp_size}"
    if kv % tp_size and tp_size % kv:
        return f"its {kv} key/value heads neither split into {tp_size} nor divide it"
    if config.intermediate_size % tp_size:
        return f"its MLP's {config.intermediate_size} features do not split into {tp_size}"
    return None


def _resolve_dtype(name: str, model_path: str) -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    if not dev.is_cuda(dev.default_device()):
        return torch.float32  # a CPU computes 16-bit types slowly, and the book checks float32
    from minisgl.utils import cached_load_hf_config

    dtype = getattr(cached_load_hf_config(model_path), "dtype", None) or torch.bfloat16
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return torch.bfloat16 if dtype == torch.float32 else dtype
