"""Chapter 21: benchmarks.

A benchmark is a workload, a clock and a count. This main shows the three parts of the
chapter's tools on this machine, at a size that runs in seconds: upstream's offline workload,
drawn exactly as upstream's benchmark/offline/bench.py draws it; the ablation's configurations
(tools/bench_ablation.py), each of which must change the time and never a token, checked
against transformers; and the online client (minisgl.benchmark.client) timing a server started
with `python -m minisgl`. Times vary from run to run and machine to machine; the counts do not.
"""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from openai import AsyncOpenAI  # noqa: E402

from examples.helpers.server_process import ServerProcess  # noqa: E402
from minisgl.benchmark.client import (  # noqa: E402
    benchmark_one_batch,
    benchmark_trace,
    get_model_name,
    make_poisson_trace,
    process_benchmark_results,
)
from minisgl.benchmark.offline import make_offline_workload, run_offline  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.env import ENV  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from tools.bench_ablation import ablation_steps, settings_at  # noqa: E402
from tools.models import PARITY_MODELS, ensure_model  # noqa: E402
from tools.parity import Case, book_dtype, build_prompts, eos_ids, run_parity_cases  # noqa: E402

NEW_TOKENS = 12
MINIATURE_BUDGET = 40  # the chunked-prefill row's token budget here: small, so prompts split
CPU_STEPS = [s for s in ablation_steps(gpu=False) if not s.gpu_only]


# ------------------------------------------------------------------ the offline workload
def show_upstream_workload() -> None:
    work = make_offline_workload()
    inputs = [len(p) for p in work.prompts]
    outputs = [p.max_tokens for p in work.sampling_params]
    print(f"{len(work.prompts)} requests; prompt lengths {min(inputs)}..{max(inputs)}, "
          f"{work.prompt_tokens:,} tokens in all; new tokens {min(outputs)}..{max(outputs)}, "
          f"{work.output_tokens:,} in all")  # fmt: skip
    temperature = work.sampling_params[0].temperature
    print(f"request 0: {inputs[0]} prompt ids starting {work.prompts[0][:6]}, "
          f"{outputs[0]} new tokens at temperature {temperature}")  # fmt: skip


# ------------------------------------------------------------------ the ablation, in miniature
@contextmanager
def environment(env: Dict[str, str]) -> Iterator[None]:
    """The MINISGL_* settings of a row, in this process (the tool starts a process per row)."""
    saved = {name: getattr(ENV, name.removeprefix("MINISGL_")).value for name in env}
    try:
        for name, value in env.items():
            getattr(ENV, name.removeprefix("MINISGL_")).value = value == "1"
        yield
    finally:
        for name, value in saved.items():
            getattr(ENV, name.removeprefix("MINISGL_")).value = value


def make_llm(name: str, row: int) -> LLM:
    engine, _ = settings_at(CPU_STEPS, row)
    if engine.get("max_extend_tokens", 0) < 1 << 20:
        engine = {**engine, "max_extend_tokens": MINIATURE_BUDGET}
    return LLM(str(ensure_model(name)), dtype=book_dtype(), page_size=4, num_page_override=512,
               max_running_req=8, **{"cuda_graph_max_bs": 0, **engine})  # fmt: skip


def shared_prefix_cases(name: str) -> List[Case]:
    """The book's prompts, each after the same 24-token preamble: a prefix a cache can reuse."""
    prompts = build_prompts(name)
    preamble = [(7 * i + 3) % 1000 + 100 for i in range(24)]
    return [Case(f"prompt {i}", preamble + p, NEW_TOKENS) for i, p in enumerate(prompts)]


def generate(name: str, cases: List[Case], row: int) -> List[List[int]]:
    with environment(settings_at(CPU_STEPS, row)[1]), make_llm(name, row) as llm:
        params = [SamplingParams(temperature=0.0, max_tokens=c.max_new_tokens) for c in cases]
        result = run_offline(llm, [c.prompt for c in cases], params)
        if name == PARITY_MODELS[0]:  # the same prompts again: what does the cache keep?
            again = run_offline(llm, [c.prompt for c in cases], params)
            counts[row] = (result.prompt_tokens, result.computed_prompt_tokens,
                           result.prefill_batches, result.decode_batches,
                           again.computed_prompt_tokens)  # fmt: skip
    eos = eos_ids(name)[:1]  # LLM.generate leaves out the EOS that ended a request
    return [t + (eos if len(t) < NEW_TOKENS else []) for t in result.token_ids]


counts: Dict[int, tuple] = {}


def show_counts() -> None:
    print(f"\n{PARITY_MODELS[0]}, what each row's scheduler did:")
    print(f"{'row':9s} {'prompt tokens':>13s} {'computed':>8s} {'prefill batches':>15s} "
          f"{'decode batches':>14s} {'computed, same prompts again':>27s}")  # fmt: skip
    for row, step in enumerate(CPU_STEPS):
        prompt, computed, prefills, decodes, again = counts[row]
        print(f"{step.name:9s} {prompt:13d} {computed:8d} {prefills:15d} {decodes:14d} "
              f"{again:27d}")  # fmt: skip


# ------------------------------------------------------------------ the online client
async def online(url: str) -> bool:
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                           timeout=120) as client:  # fmt: skip
        model = await get_model_name(client)
        prompts = [f"Request {i}: tell me about the number {i * 37}." for i in range(8)]
        lengths = [8 + 2 * i for i in range(8)]
        print(f"8 streamed chat requests to {Path(model).name}, {sum(lengths)} new tokens, "
              "sent all at once:")  # fmt: skip
        raw = await benchmark_one_batch(client, prompts, lengths, model)
        batch = process_benchmark_results(raw)
        for line in batch.report():
            print("  " + line)
        trace = make_poisson_trace(prompts, lengths, rate=20.0, seed=0)
        times = ", ".join(f"{t.timestamp * 1000:.0f}" for t in trace[:4])
        print(f"the same, arriving as a Poisson process at 20 per second (at {times} ... ms):")
        paced = process_benchmark_results(await benchmark_trace(client, trace, model))
        for line in paced.report():
            print("  " + line)
    return batch.num_tokens == paced.num_tokens == sum(lengths)


def main() -> int:
    print("== upstream's offline workload (benchmark/offline/bench.py), drawn by "
          "make_offline_workload()")  # fmt: skip
    show_upstream_workload()

    print("\n== the ablation's rows on a CPU (tools/bench_ablation.py), each against transformers")
    for step in CPU_STEPS:
        print(f"  {step.name:9s} {step.label}")
    summary = run_parity_cases(
        generate,
        shared_prefix_cases,
        models=PARITY_MODELS,
        runs=len(CPU_STEPS),
        run_label=("configuration", lambda name, row: CPU_STEPS[row].name),
    )
    show_counts()

    print("\n== the online client (minisgl.benchmark.client) against python -m minisgl")
    with ServerProcess(ensure_model(PARITY_MODELS[0]), "--num-pages", "1024", "--dtype",
                       "float32") as server:  # fmt: skip
        online_ok = asyncio.run(online(server.url))
    return 0 if summary.ok and online_ok else 1


if __name__ == "__main__":
    sys.exit(main())
