"""Chapter 22: the gap to SGLang.

The chapter adds no code: it says what production engines have that this one lacks, and where
each feature would go. This main keeps the page honest. It resolves every place the page says
a feature plugs into, in this tree, and prints where it is; it works out from the models'
configs what an FP8 KV cache would hold, the number behind quantisation's section; and it
checks the engine the book leaves behind against transformers one last time.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.models import ModelConfig  # noqa: E402
from tools.models import MOE_PARITY_MODELS, SMOLLM2, ensure_model  # noqa: E402
from tools.parity import book_dtype, eos_ids, run_parity  # noqa: E402

NEW_TOKENS = 16  # per prompt of the parity check
# (feature, the places in minisgl it would change), in the page's order
PLUG_POINTS: List[Tuple[str, List[str]]] = [
    ("speculative decoding", [
        "core.Req.complete_one", "scheduler.scheduler._make_positions",
        "scheduler.cache.CacheManager.free_uncomputed", "models.utils.DecoderForCausalLM.forward",
        "engine.sample.Sampler.sample", "engine.graph.GraphRunner.can_use_cuda_graph",
    ]),
    ("structured output", [
        "server.protocol.UNSUPPORTED", "server.protocol.CompletionParams.sampling_params",
        "scheduler.scheduler.Scheduler._process_last_data", "engine.sample.Sampler.prepare",
        "engine.engine.Engine.forward_batch",
    ]),
    ("quantisation", [
        "layers.linear._LinearTPImpl", "models.weight.load_weight", "layers.moe.MoELayer",
        "kvcache.create_kvcache_pool", "kvcache.mha_pool.MHAKVCache.store_kv",
        "kernel.store.store_cache", "engine.engine.Engine._determine_num_pages",
    ]),
    ("prefill-decode disaggregation", [
        "scheduler.prefill.PrefillManager", "scheduler.decode.DecodeManager.filter_reqs",
        "message.backend.UserMsg", "kvcache.mha_pool.MHAKVCache.k_cache",
    ]),
    ("expert and data parallelism", [
        "layers.moe.MoELayer", "moe.base.BaseMoeBackend.forward",
        "distributed.impl.DistributedImpl", "scheduler.io.SchedulerIOMixin",
    ]),
    ("hierarchical KV cache", [
        "kvcache.radix_cache.RadixPrefixCache.evict", "kvcache.base.MatchResult",
        "scheduler.cache.CacheManager.match_req", "scheduler.prefill.PrefillAdder",
        "utils.device.Stream",
    ]),
    ("multi-LoRA", [
        "layers.linear._LinearTPImpl.forward", "scheduler.scheduler.Scheduler._prepare_batch",
        "kvcache.radix_cache._get_key_fn", "engine.graph.GraphCaptureBuffer",
    ]),
    ("multimodal input", [
        "models.weight.load_weight", "message.tokenizer.TokenizeMsg",
        "tokenizer.tokenize.TokenizeManager.tokenize_one", "models.utils.DecoderModel.forward",
    ]),
    ("scheduling policies", [
        "scheduler.prefill.PrefillManager.schedule_next_batch",
        "scheduler.decode.DecodeManager.inflight_tokens",
        "scheduler.scheduler.Scheduler._schedule_next_batch",
    ]),
]  # fmt: skip


def resolve(dotted: str) -> Tuple[Any, str, int]:
    """The object `minisgl.<dotted>` names, its file (relative to the tree) and first line."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        candidate = "minisgl." + ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(candidate)
        except ModuleNotFoundError as e:
            if not (e.name and (candidate + ".").startswith(e.name + ".")):
                raise  # the module exists, but something it imports does not
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)  # AttributeError: the page names something that is gone
        break
    else:
        raise ModuleNotFoundError(f"no module in minisgl.{dotted}")
    source = inspect.unwrap(obj.fget if isinstance(obj, property) else obj)
    if isinstance(source, (dict, list, tuple)):  # a constant: where its module is
        module = importlib.import_module("minisgl." + ".".join(parts[:split]))
        lines, _ = inspect.getsourcelines(module)
        line = next(i for i, text in enumerate(lines, 1) if text.startswith(parts[-1]))
        path = inspect.getsourcefile(module)
    else:
        path, line = inspect.getsourcefile(source), inspect.getsourcelines(source)[1]
    root = Path(__file__).resolve().parents[1]
    return obj, Path(path or "").resolve().relative_to(root).as_posix(), line


def show_plug_points() -> int:
    count = 0
    for feature, names in PLUG_POINTS:
        print(feature)
        for name in names:
            _, path, line = resolve(name)
            print(f"  {name:52s} {path}:{line}")
            count += 1
    return count


def kv_bytes_per_token(config: ModelConfig, itemsize: int) -> int:
    """Keys and values of one token, every layer: what a KV pool stores per cached token."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize


def show_fp8_capacity() -> None:
    from transformers import AutoConfig, Qwen3Config

    from tools.bench_gpu import QWEN3_0_6B

    configs = {
        "Qwen3-0.6B": Qwen3Config(**{k: v for k, v in QWEN3_0_6B.items() if k != "architectures"}),
        SMOLLM2: AutoConfig.from_pretrained(ensure_model(SMOLLM2)),
    }
    gib = 1 << 30
    print(f"{'model':14s} {'layers':>6s} {'kv heads':>8s} {'head dim':>8s} "
          f"{'bytes/token bf16':>16s} {'fp8':>7s} "
          f"{'tokens in 1 GiB bf16':>20s} {'fp8':>7s}")  # fmt: skip
    for name, hf in configs.items():
        config = ModelConfig.from_hf(hf)
        bf16, fp8 = kv_bytes_per_token(config, 2), kv_bytes_per_token(config, 1)
        print(f"{name:14s} {config.num_layers:6d} {config.num_kv_heads:8d} {config.head_dim:8d} "
              f"{bf16:16,d} {fp8:7,d} {gib // bf16:20,d} {gib // fp8:7,d}")  # fmt: skip


def generate(name: str, prompts: List[List[int]], max_new_tokens: int) -> List[List[int]]:
    with LLM(str(ensure_model(name)), dtype=book_dtype(), num_page_override=512) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        outputs = llm.generate(prompts, params)
    eos = eos_ids(name)[:1]  # LLM.generate leaves out the EOS that ended a request
    return [o["token_ids"] + (eos if len(o["token_ids"]) < max_new_tokens else [])  # type: ignore[operator]
            for o in outputs]  # fmt: skip


def main() -> int:
    print("== where each feature would go: every place the page names, found in this tree")
    count = show_plug_points()
    features = len(PLUG_POINTS)
    print(f"{count} places for {features} features, all found")

    print("\n== an FP8 KV cache, from the models' configs (keys and values, every layer)")
    show_fp8_capacity()

    print("\n== the engine the book leaves behind, every token against transformers")
    summary = run_parity(generate, models=MOE_PARITY_MODELS, max_new_tokens=NEW_TOKENS)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
