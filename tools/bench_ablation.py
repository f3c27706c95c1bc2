"""Chapter 21's measurements: what each optimisation buys, throughput against batch size, and
where a decode step's time goes; on this machine's CPU, or on an NVIDIA GPU when there is one.

    python tools/bench_ablation.py ablation     # docs/data/ch21-ablation-{cpu,gpu}.{md,json}
    python tools/bench_ablation.py batch        # docs/data/ch21-batch-{cpu,gpu}.json
    python tools/bench_ablation.py split        # docs/data/ch21-split-{cpu,gpu}.json
    python tools/plot_benchmarks.py             # the two plots, from the JSON files

**ablation.** The engine with every optimisation off, then one turned on per row, in the order
of the issue that asked for the table: the paged PyTorch attention backend replaced by
FlashInfer, CUDA graphs, overlap scheduling, the radix cache, chunked prefill (a token budget
per prefill batch; "off" is no budget: every waiting prompt in one prefill batch) and the
custom kernels of chapter 19 with FlashInfer's norms (off: MINISGL_DISABLE_CUSTOM_KERNELS=1).
On a GPU the workload is upstream's offline benchmark (tools/bench_gpu.py's model: Qwen3-0.6B's
shape, random weights, bfloat16; page size 256). On a CPU it is chapter 11's (SmolLM2 in
float32, 32 chat requests under one system prompt, 48 new tokens each): FlashInfer and CUDA
graphs exist only on a GPU, and their rows say so. Every configuration runs in a fresh process;
each row is the best of --repeat runs (default: 3 on a CPU, 1 on a GPU).

**batch.** Decode throughput with b requests at once (b prompts of random ids, the same number
of new tokens each, the full engine with at most b running): generated tokens per second.

**split.** A decode step's time in parts. On a CPU the layers' forward methods are timed
directly (self time: a layer's time less that of the layers it calls), and what is left of a
step is the scheduler's and the model's glue. On a GPU, torch.profiler lists the kernels of the
run; each goes into a part by its name, and the host's share is the step's wall time less the
GPU's busy time (the step waits for the host when the GPU is idle).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "docs" / "data"
CHILD_TIMEOUT_S = 560


@dataclass(frozen=True)
class Step:
    """One row of the ablation: the setting it turns on."""

    name: str
    label: str
    engine: Dict[str, Any]  # LLM keyword arguments
    env: Dict[str, str] = field(default_factory=dict)
    gpu_only: bool = False


def ablation_steps(gpu: bool) -> List[Step]:
    """Cumulative: each step's settings apply to every later row."""
    budget = 16384 if gpu else 512
    return [
        Step("baseline", "everything off: paged PyTorch attention (ch05), no CUDA graphs, "
             "no overlap, naive cache, no prefill budget, PyTorch kernels",
             dict(attention_backend="torch", cuda_graph_max_bs=0, cache_type="naive",
                  max_extend_tokens=1 << 20),
             {"MINISGL_DISABLE_OVERLAP_SCHEDULING": "1", "MINISGL_DISABLE_CUSTOM_KERNELS": "1"}),
        Step("fi", "+ FlashInfer attention (ch17)", dict(attention_backend="fi"), gpu_only=True),
        Step("graph", "+ CUDA graphs up to batch 256 (ch18)", dict(cuda_graph_max_bs=256),
             gpu_only=True),
        Step("overlap", "+ overlap scheduling (ch11)", {},
             {"MINISGL_DISABLE_OVERLAP_SCHEDULING": "0"}),
        Step("radix", "+ radix cache (ch09)", dict(cache_type="radix")),
        Step("chunked", f"+ chunked prefill, budget {budget} tokens (ch10)",
             dict(max_extend_tokens=budget)),
        Step("kernels", "+ custom kernels (ch19; on a GPU also FlashInfer's norms, SiLU, RoPE)",
             {}, {"MINISGL_DISABLE_CUSTOM_KERNELS": "0"}),
    ]  # fmt: skip


def settings_at(steps: List[Step], upto: int) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The engine's settings and environment for row `upto` (GPU-only rows count on a GPU)."""
    engine: Dict[str, Any] = {}
    env: Dict[str, str] = {}
    on_gpu = gpu()
    for step in steps[: upto + 1]:
        if step.gpu_only and not on_gpu:
            continue
        engine.update(step.engine)
        env.update(step.env)
    return engine, env


# ------------------------------------------------------------------ engines and workloads
def gpu() -> bool:
    import torch

    return torch.cuda.is_available() and os.environ.get("MINISGL_DEVICE") != "cpu"


def make_llm(**settings: Any):
    import torch

    from minisgl.llm import LLM

    if gpu():
        from tools.bench_gpu import model_folder

        base = dict(page_size=256, max_seq_len_override=4096, use_dummy_weight=True)
        return LLM(str(model_folder()), dtype=torch.bfloat16, **{**base, **settings})
    from tools.models import SMOLLM2, ensure_model

    base = dict(page_size=16, num_page_override=2048, cuda_graph_max_bs=0)
    return LLM(str(ensure_model(SMOLLM2)), dtype=torch.float32, **{**base, **settings})


def ablation_workload():
    from minisgl.benchmark.offline import OfflineWorkload, make_offline_workload
    from minisgl.core import SamplingParams

    if gpu():
        return make_offline_workload()
    from transformers import AutoTokenizer

    from tools.bench_offline import NEW_TOKENS, workload
    from tools.models import SMOLLM2, ensure_model

    prompts = workload(AutoTokenizer.from_pretrained(ensure_model(SMOLLM2)))
    params = [SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)] * len(prompts)
    return OfflineWorkload(prompts, params)


def child_ablation(settings: Dict[str, Any], repeat: int) -> Dict[str, Any]:
    from minisgl.benchmark.offline import run_offline
    from minisgl.core import SamplingParams

    work = ablation_workload()
    best: Dict[str, Any] = {}
    for _ in range(repeat):
        # a fresh engine per run: a prefix cache left warm by the last run would flatter it
        with make_llm(**settings) as llm:
            llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.1, max_tokens=8))
            result = run_offline(llm, work.prompts, work.sampling_params)
        assert result.output_tokens == work.output_tokens, result.output_tokens
        if not best or result.seconds < best["seconds"]:
            best = dict(seconds=result.seconds, tokens=result.output_tokens,
                        computed=result.computed_prompt_tokens, prompt_tokens=result.prompt_tokens,
                        prefill_batches=result.prefill_batches,
                        decode_batches=result.decode_batches)  # fmt: skip
    return best


def batch_job(b: int) -> Tuple[List[List[int]], Any]:
    import random

    from minisgl.core import SamplingParams

    prompt_len, new = (256, 256) if gpu() else (64, 32)
    rng = random.Random(b)
    prompts = [[rng.randint(0, 10000) for _ in range(prompt_len)] for _ in range(b)]
    return prompts, SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=new)


def batch_sizes() -> List[int]:
    return [1, 2, 4, 8, 16, 32, 64, 128, 256] if gpu() else [1, 2, 4, 8, 16, 32]


def child_batch(settings: Dict[str, Any], repeat: int) -> Dict[str, Any]:
    from minisgl.benchmark.offline import run_offline
    from minisgl.core import SamplingParams

    sizes = batch_sizes()
    points = []
    with make_llm(max_running_req=max(sizes), **settings) as llm:
        llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.1, max_tokens=8))
        for b in sizes:
            prompts, params = batch_job(b)
            runs = [run_offline(llm, prompts, [params] * b) for _ in range(repeat)]
            best = min(runs, key=lambda r: r.seconds)
            points.append(dict(batch=b, seconds=best.seconds, tokens=best.output_tokens,
                               decode_batches=best.decode_batches))  # fmt: skip
            print(f"batch {b}: {best.throughput:,.0f} tokens/s", file=sys.stderr, flush=True)
    return dict(points=points, prompt_len=len(prompts[0]), new_tokens=params.max_tokens)


# ------------------------------------------------------------------ the step split
class SelfTimer:
    """Self time per part: a wrapped call's time less that of the wrapped calls inside it.
    Only calls made while `active` is set count (the decode steps)."""

    def __init__(self) -> None:
        self.totals: Dict[str, float] = defaultdict(float)
        self.stack: List[List[Any]] = []
        self.active = False

    def wrap(self, owner: Any, name: str, part: str) -> None:
        original = getattr(owner, name)
        timer = self

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            timer.stack.append([time.perf_counter(), 0.0])
            try:
                return original(*args, **kwargs)
            finally:
                start, inner = timer.stack.pop()
                spent = time.perf_counter() - start
                if timer.active:
                    timer.totals[part] += spent - inner
                if timer.stack:
                    timer.stack[-1][1] += spent

        setattr(owner, name, timed)


SPLIT_SIZES_GPU = [1, 16, 64, 256]
SPLIT_SIZES_CPU = [1, 8, 32]
GPU_PARTS = [  # the first pattern a kernel's name contains decides its part
    ("matrix products", ("_gate_up_silu_kernel",)),  # a product that ends with SiLU (P1)
    ("norms, SiLU, RoPE", ("RMSNorm", "norm::", "act_and_mul", "Rotary", "silu", "rope",
                           "_add_slices_rmsnorm")),
    ("matrix products", ("_slice_products",)),  # o and down split over their inputs (P1)
    ("attention", ("BatchDecode", "BatchPrefill", "MergeStates", "flash_fwd", "Attention",
                   "_decode_piece_kernel", "_decode_merge_kernel")),
    ("matrix products", ("gemm", "Gemm", "GEMM", "cutlass", "nvjet", "xmma", "cublas", "splitK",
                         "fused_moe_kernel")),
    ("KV store, embedding", ("store_kv", "index_kernel", "embedding")),
    ("sampling", ("SoftMax", "softmax", "ArgMax", "multinomial", "exponential", "Distribution",
                  "sampling", "Sampling", "topk", "sort", "_gumbel_max_kernel")),
]  # fmt: skip


def gpu_part(kernel: str) -> str:
    for part, patterns in GPU_PARTS:
        if any(p in kernel for p in patterns):
            return part
    return "other kernels"


def child_split(settings: Dict[str, Any], repeat: int) -> Dict[str, Any]:
    from minisgl.core import SamplingParams

    sizes = SPLIT_SIZES_GPU if gpu() else SPLIT_SIZES_CPU
    new = 256 if gpu() else 32
    rows = []
    with make_llm(max_running_req=max(sizes), **settings) as llm:
        llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.1, max_tokens=8))
        for b in sizes:
            prompts = [[7 + i, 11, 13, 17, 19, 23, 29, 31] for i in range(b)]
            params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=new)
            measure = split_gpu if gpu() else split_cpu
            rows.append(dict(batch=b, **measure(llm, prompts, params)))
            print(rows[-1], file=sys.stderr, flush=True)
    return dict(rows=rows, prompt_len=8, new_tokens=new)


def split_gpu(llm: Any, prompts: List[List[int]], params: Any) -> Dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from minisgl.benchmark.offline import run_offline

    plain = run_offline(llm, prompts, [params] * len(prompts))  # the step time, unprofiled
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        profiled = run_offline(llm, prompts, [params] * len(prompts))
        torch.cuda.synchronize()
    kernels: Dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] += event.time_range.elapsed_us() / 1e3  # ms
    parts: Dict[str, float] = defaultdict(float)
    for name, ms in kernels.items():
        parts[gpu_part(name)] += ms
    steps = profiled.decode_batches + profiled.prefill_batches
    step_ms = plain.seconds * 1e3 / steps
    per_step = {part: ms / steps for part, ms in parts.items()}
    per_step["host (GPU idle)"] = max(0.0, step_ms - sum(per_step.values()))
    ranked = sorted(kernels.items(), key=lambda item: -item[1])
    every_kernel = [dict(name=name[:160], part=gpu_part(name), ms_per_step=ms / steps)
                    for name, ms in ranked]  # fmt: skip
    return dict(step_ms=step_ms, parts=per_step, steps=steps, kernels=every_kernel)


def split_cpu(llm: Any, prompts: List[List[int]], params: Any) -> Dict[str, Any]:
    from minisgl.benchmark.offline import run_offline
    from minisgl.engine.engine import Engine
    from minisgl.engine.sample import Sampler
    from minisgl.kvcache.mha_pool import MHAKVCache
    from minisgl.layers import attention, embedding, linear, norm, rotary
    from minisgl.models import utils as model_utils

    timer = SelfTimer()
    originals = []
    wrapped = [
        (linear._LinearTPImpl, "forward", "matrix products"),
        (linear._RowParallel, "forward", "matrix products"),
        (embedding.ParallelLMHead, "forward", "matrix products"),
        (embedding.VocabParallelEmbedding, "forward", "KV store, embedding"),
        (attention.AttentionLayer, "forward", "attention"),
        (rotary.RotaryEmbedding, "forward", "norms, SiLU, RoPE"),
        (MHAKVCache, "store_kv", "KV store, embedding"),
        (norm.RMSNorm, "forward", "norms, SiLU, RoPE"),
        (norm.RMSNormFused, "forward", "norms, SiLU, RoPE"),
        (model_utils.GatedMLP, "forward", "norms, SiLU, RoPE"),  # its self time: the SiLU
        (Sampler, "sample", "sampling"),
        (Engine, "forward_batch", "model glue"),
    ]
    for owner, name, part in wrapped:
        originals.append((owner, name, owner.__dict__[name]))
        timer.wrap(owner, name, part)
    plain_forward = Engine.forward_batch
    prefill_seconds = [0.0]

    def forward_batch(engine: Any, batch: Any, args: Any) -> Any:
        timer.active = not batch.is_prefill
        begin = time.perf_counter()
        try:
            return plain_forward(engine, batch, args)
        finally:
            if batch.is_prefill:
                prefill_seconds[0] += time.perf_counter() - begin
            timer.active = False

    Engine.forward_batch = forward_batch  # type: ignore[method-assign]
    try:
        result = run_offline(llm, prompts, [params] * len(prompts))
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    steps = result.decode_batches
    per_step = {part: seconds * 1e3 / steps for part, seconds in timer.totals.items()}
    step_ms = (result.seconds - prefill_seconds[0]) * 1e3 / steps
    per_step["scheduler"] = max(0.0, step_ms - sum(per_step.values()))
    return dict(step_ms=step_ms, parts=per_step, steps=steps)


# ------------------------------------------------------------------ the parent
def run_child(kind: str, engine: Dict[str, Any], env: Dict[str, str], repeat: int) -> Dict:
    from tools.bench_gpu import run_for_result

    spec = json.dumps(dict(kind=kind, engine=engine, repeat=repeat))
    return run_for_result([__file__, "--child", spec], CHILD_TIMEOUT_S, env)


def machine() -> str:
    import torch

    if gpu():
        return f"one {torch.cuda.get_device_name()}, torch {torch.__version__}"
    return (f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} "
            f"threads, torch {torch.__version__})")  # fmt: skip


def ablation(repeat: int, out: Path, only: List[str] | None) -> None:
    """Every row, or the rows in `only` merged into the table already in `out`; the files are
    written after each row (a run cut short keeps the rows it finished)."""
    on_gpu = gpu()
    device = "gpu" if on_gpu else "cpu"
    json_path, md_path = out / f"ch21-ablation-{device}.json", out / f"ch21-ablation-{device}.md"
    steps = ablation_steps(on_gpu)
    done: Dict[str, Dict[str, Any]] = {}
    if only and json_path.exists():
        done = {row["name"]: row for row in json.loads(json_path.read_text())["rows"]}
    for i, step in enumerate(steps):
        if only and step.name not in only:
            continue
        if step.gpu_only and not on_gpu:
            done[step.name] = dict(name=step.name, label=step.label, gpu_only=True)
        else:
            engine, env = settings_at(steps, i)
            done[step.name] = dict(name=step.name, label=step.label,
                                   **run_child("ablation", engine, env, repeat))  # fmt: skip
            row = done[step.name]
            print(f"{step.name}: {row['tokens'] / row['seconds']:,.1f} tokens/s",
                  file=sys.stderr, flush=True)  # fmt: skip
        rows = [done[s.name] for s in steps if s.name in done]
        data = dict(machine=machine(), repeat=repeat, rows=rows)
        json_path.write_text(json.dumps(data, indent=1) + "\n")
        md_path.write_text(ablation_table(data, on_gpu))
    print(md_path.read_text())


def ablation_table(data: Dict[str, Any], on_gpu: bool) -> str:
    if on_gpu:
        what = ("upstream's offline workload (256 requests, prompts of 100 to 1024 random ids, "
                "100 to 1024 new tokens each, temperature 0.6), Qwen3-0.6B's shape with random "
                "weights, bfloat16, page size 256")  # fmt: skip
    else:
        what = ("chapter 11's workload (32 chat requests under one system prompt, 48 new "
                "tokens each), SmolLM2-135M-Instruct, float32, page size 16")  # fmt: skip
    lines = [
        f"{what}; {data['machine']}; best of {data['repeat']} run(s) per row. Regenerate with "
        "`python tools/bench_ablation.py ablation`.",
        "",
        "| configuration | seconds | generated tokens/s | vs the row above | prompt tokens "
        "computed | prefill batches | decode batches |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    previous = None
    for row in data["rows"]:
        if row.get("gpu_only"):
            lines.append(f"| {row['label']} | GPU only | | | | | |")
            continue
        rate = row["tokens"] / row["seconds"]
        change = f"{rate / previous:.2f}x" if previous else ""
        previous = rate
        lines.append(
            f"| {row['label']} | {row['seconds']:.1f} | {rate:,.1f} | {change} | "
            f"{row['computed']:,} | {row['prefill_batches']} | {row['decode_batches']:,} |"
        )
    return "\n".join(lines) + "\n"


def full_engine(on_gpu: bool) -> Tuple[Dict[str, Any], Dict[str, str]]:
    steps = ablation_steps(on_gpu)
    return settings_at(steps, len(steps) - 1)


def batch(repeat: int, out: Path) -> None:
    on_gpu = gpu()
    engine, env = full_engine(on_gpu)
    curves = {"full engine": run_child("batch", engine, env, repeat)}
    if on_gpu:
        curves["without CUDA graphs"] = run_child("batch", {**engine, "cuda_graph_max_bs": 0},
                                                  env, repeat)  # fmt: skip
    data = dict(machine=machine(), repeat=repeat, curves=curves)
    path = out / f"ch21-batch-{'gpu' if on_gpu else 'cpu'}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")


def split(out: Path) -> None:
    on_gpu = gpu()
    engine, env = full_engine(on_gpu)
    data = dict(machine=machine(), **run_child("split", engine, env, 1))
    path = out / f"ch21-split-{'gpu' if on_gpu else 'cpu'}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=["ablation", "batch", "split"])
    parser.add_argument("--repeat", type=int, help="runs per row or point (best is kept)")
    parser.add_argument("--only", help="ablation rows to run, by name (comma-separated)")
    parser.add_argument("--out", type=Path, default=DATA)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        work: Dict[str, Callable[[Dict[str, Any], int], Dict]] = {
            "ablation": child_ablation, "batch": child_batch, "split": child_split,
        }  # fmt: skip
        result = work[spec["kind"]](spec["engine"], spec["repeat"])
        from tools.bench_gpu import print_result

        print_result(result)
        return
    if args.what is None:
        parser.error("say what to measure: ablation, batch or split")
    repeat = args.repeat or (1 if gpu() else 3)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "ablation":
        ablation(repeat, args.out, args.only.split(",") if args.only else None)
    elif args.what == "batch":
        batch(repeat, args.out)
    else:
        split(args.out)


if __name__ == "__main__":
    main()
