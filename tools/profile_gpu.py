"""Where the time of upstream's offline workload goes in our engine, on an NVIDIA GPU.

    python tools/profile_gpu.py                  # all three reports into /tmp/minisgl-profile
    python tools/profile_gpu.py steps --out DIR  # some of them

The engine and the workload are tools/bench_gpu.py's (Qwen3-0.6B's shape, random weights,
bfloat16, FlashInfer, CUDA graphs, overlap on; upstream's 256 requests). One engine, one
warm-up request, then one run per report:

* steps: the timed generate with a log of every forward pass: the host's seconds in the
  scheduler's parts, CUDA events around `engine.forward_batch`, and for consecutive decode
  steps the interval between two launches against the GPU time of a step. When the two are
  equal the GPU is the limit; when the interval is longer, the host is.
* host: the same generate under cProfile (where the host's time goes).
* kernels: torch.profiler over 128 of the requests with 200 new tokens each (the CUDA
  kernels by total time, and the host's operators by their own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from tools.bench_gpu import build_engine, workload  # noqa: E402


def report(out: Path, name: str, text: str) -> None:
    (out / name).write_text(text)
    print(f"==== {name}\n{text[:6000]}", flush=True)


def params_for(new_tokens: List[int]) -> List[SamplingParams]:
    return [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in new_tokens]


@dataclass
class Step:
    launched: float  # host clock when engine.forward_batch was called
    host_ms: float  # how long that call took on the host
    phase: str
    size: int  # requests
    tokens: int  # new tokens
    began: torch.cuda.Event
    ended: torch.cuda.Event

    @property
    def gpu_ms(self) -> float:
        return self.began.elapsed_time(self.ended)


SCHEDULER_PARTS = {
    "receive": "receive_msg",
    "schedule": "_schedule_next_batch",
    "prepare": "_prepare_batch",
    "forward": "_forward",
    "process": "_process_last_data",
}


def steps(llm: LLM, out: Path) -> None:
    prompts, new_tokens = workload()
    log: List[Step] = []
    seconds = {part: 0.0 for part in SCHEDULER_PARTS}
    saved = {attr: llm.__dict__.get(attr) for attr in SCHEDULER_PARTS.values()}

    def timed(part: str, call: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                seconds[part] += time.perf_counter() - began

        return wrapper

    for part, attr in SCHEDULER_PARTS.items():
        setattr(llm, attr, timed(part, getattr(llm, attr)))
    engine_forward = llm.engine.forward_batch

    def forward_batch(batch, args):
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        tokens = sum(r.extend_len for r in batch.reqs)
        launched = time.perf_counter()
        began.record()
        out = engine_forward(batch, args)
        ended.record()
        host_ms = (time.perf_counter() - launched) * 1e3
        log.append(Step(launched, host_ms, batch.phase, batch.size, tokens, began, ended))
        return out

    llm.engine.forward_batch = forward_batch
    try:
        began = time.perf_counter()
        outputs = llm.generate(prompts, params_for(new_tokens))
        torch.cuda.synchronize()
        wall = time.perf_counter() - began
    finally:
        del llm.engine.forward_batch
        for attr, value in saved.items():
            if value is None:
                delattr(llm, attr)
            else:
                setattr(llm, attr, value)
    generated = sum(len(o["token_ids"]) for o in outputs)
    lines = [f"{generated} tokens in {wall:.2f} s = {generated / wall:,.0f} tokens/s"]
    lines.append("host seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()))
    for phase in ("prefill", "decode"):
        rows = [s for s in log if s.phase == phase]
        if rows:
            gpu = [s.gpu_ms for s in rows]
            lines.append(
                f"{phase}: {len(rows)} steps, {statistics.mean(s.tokens for s in rows):.0f} "
                f"tokens per step, GPU ms per step mean {statistics.mean(gpu):.2f} median "
                f"{statistics.median(gpu):.2f} sum {sum(gpu) / 1e3:.2f} s; host ms in "
                f"forward_batch mean {statistics.mean(s.host_ms for s in rows):.2f}"
            )
    bands: Dict[int, List[Tuple[float, float]]] = {}
    for step, following in zip(log, log[1:]):
        if step.phase == following.phase == "decode":
            band = min(256, 1 << (step.size - 1).bit_length())
            interval = (following.launched - step.launched) * 1e3
            bands.setdefault(band, []).append((interval, step.gpu_ms))
    lines.append("consecutive decode steps by batch size: steps, median ms between launches, "
                 "median GPU ms")  # fmt: skip
    for band, pairs in sorted(bands.items()):
        interval = statistics.median(i for i, _ in pairs)
        gpu = statistics.median(g for _, g in pairs)
        lines.append(f"  <= {band:3d}: {len(pairs):5d} {interval:8.2f} {gpu:8.2f}")
    busy = sum(s.gpu_ms for s in log) / 1e3
    lines.append(f"GPU time of all steps: {busy:.2f} s of {wall:.2f} s")
    report(out, "steps.txt", "\n".join(lines) + "\n")


def host(llm: LLM, out: Path) -> None:
    prompts, new_tokens = workload()
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    llm.generate(prompts, params_for(new_tokens))
    torch.cuda.synchronize()
    profile.disable()
    seconds = time.perf_counter() - began
    s = io.StringIO()
    stats = pstats.Stats(profile, stream=s)
    s.write(f"under cProfile: {seconds:.2f} s\n")
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(60)
    report(out, "host.txt", s.getvalue())


def kernels(llm: LLM, out: Path) -> None:
    prompts, new_tokens = workload()
    prompts, new_tokens = prompts[:128], [200] * 128
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params_for(new_tokens))
        torch.cuda.synchronize()
    table_cuda = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=40, max_name_column_width=70
    )
    table_cpu = prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70
    )
    report(out, "kernels.txt", "BY CUDA TIME\n" + table_cuda + "\n\nBY SELF CPU TIME\n" + table_cpu)


REPORTS: Dict[str, Callable[[LLM, Path], None]] = {
    "steps": steps,
    "host": host,
    "kernels": kernels,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", help=f"some of {', '.join(REPORTS)} (default: all)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/minisgl-profile"))
    args = parser.parse_args()
    unknown = [r for r in args.reports if r not in REPORTS]
    if unknown:
        parser.error(f"unknown report(s) {', '.join(unknown)}; choose from {', '.join(REPORTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    llm = build_engine("fi-graphs")
    try:
        for name in args.reports or list(REPORTS):
            REPORTS[name](llm, args.out)
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
