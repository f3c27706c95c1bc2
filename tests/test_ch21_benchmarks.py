"""Chapter 21: the benchmark tools. The offline workload against upstream's way of drawing it,
the online client's metrics against times worked out by hand, the timers, the counts of a run,
the switch that turns the custom kernels off, the ablation's settings and the plots.
"""

from __future__ import annotations

import asyncio
import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List

import pytest
import torch

from minisgl.benchmark.client import (
    BenchmarkTrace,
    RawResult,
    Stats,
    benchmark_one,
    make_poisson_trace,
    process_benchmark_results,
    scale_traces,
)
from minisgl.benchmark.offline import make_offline_workload, run_offline
from minisgl.benchmark.perf import compare_memory_kernel_perf, perf_cpu
from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.kernel import store as store_module
from minisgl.kernel.utils import use_custom_kernels
from minisgl.layers.gpu import flashinfer_for
from minisgl.llm import LLM
from minisgl.llm.llm import RequestStatus
from minisgl.message import DetokenizeMsg

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the offline workload
def test_the_offline_workload_is_upstreams_draw() -> None:
    # upstream's benchmark/offline/bench.py, with the global random module
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))]
               for _ in range(256)]  # fmt: skip
    new_tokens = [random.randint(100, 1024) for _ in range(256)]
    work = make_offline_workload()
    assert work.prompts == prompts
    assert [p.max_tokens for p in work.sampling_params] == new_tokens
    assert all(p.ignore_eos and p.temperature == 0.6 for p in work.sampling_params)
    assert work.output_tokens == sum(new_tokens) == 133_966


def test_a_smaller_workload_keeps_its_ranges() -> None:
    work = make_offline_workload(40, 30, 9, min_input_len=5, min_output_len=2, vocab_size=99)
    assert len(work.prompts) == 40
    assert all(5 <= len(p) <= 30 and max(p) <= 99 for p in work.prompts)
    assert all(2 <= p.max_tokens <= 9 for p in work.sampling_params)
    assert work.prompt_tokens == sum(len(p) for p in work.prompts)


# ------------------------------------------------------------------ the online metrics
def raw(tics: List[float], tokens: int | None = None) -> RawResult:
    n = len(tics) - 1 if tokens is None else tokens
    return RawResult(input_len=None, output_len=n, message="m", tics=tics, tokens=n)


def test_stats_are_nearest_rank_percentiles() -> None:
    stats = Stats.of([float(v) for v in range(100, 0, -1)])
    assert (stats.avg, stats.p50, stats.p90, stats.p99, stats.max) == (50.5, 51, 91, 100, 100)
    with pytest.raises(ValueError):
        Stats.of([])


def test_process_benchmark_results_computes_the_serving_metrics() -> None:
    # request a: sent at 0, pieces at 1.0, 1.5, 2.5; request b: sent at 0.5, pieces at 2, 3
    result = process_benchmark_results([raw([0.0, 1.0, 1.5, 2.5]), raw([0.5, 2.0, 3.0])])
    assert result.num_requests == 2 and result.num_tokens == 5
    assert result.ttft.avg == pytest.approx(1.25)  # 1.0 and 1.5
    assert result.tpot.max == pytest.approx(1.0)  # b: (3 - 2) / 1; a: (2.5 - 1) / 2
    assert result.tpot.avg == pytest.approx(0.875)
    assert sorted([result.itl.p50, result.itl.max]) == pytest.approx([1.0, 1.0])
    assert result.itl.avg == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    assert result.e2e.max == pytest.approx(2.5)  # both
    assert result.duration == pytest.approx(3.0)
    assert result.token_throughput == pytest.approx(5 / 3)
    assert any(line.startswith("TTFT 1250.0 ms") for line in result.report())


def test_process_benchmark_results_refuses_a_short_answer() -> None:
    short = RawResult(input_len=None, output_len=8, message="m", tics=[0.0, 1.0], tokens=3)
    with pytest.raises(RuntimeError, match="asked for 8 tokens and got 3"):
        process_benchmark_results([short])


def test_a_poisson_trace_has_the_rate_it_was_given() -> None:
    prompts = [f"p{i}" for i in range(4000)]
    trace = make_poisson_trace(prompts, [4] * 4000, rate=50.0, seed=3)
    gaps = [b.timestamp - a.timestamp for a, b in zip(trace, trace[1:])]
    assert trace[0].timestamp == 0.0 and min(gaps) > 0
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 50, rel=0.05)
    assert make_poisson_trace(prompts, [4] * 4000, 50.0, seed=3) == trace


def test_scale_traces_stretches_the_gaps_and_sorts() -> None:
    traces = [BenchmarkTrace(5.0, "b", 1), BenchmarkTrace(3.0, "a", 1), BenchmarkTrace(9.0, "c", 1)]
    scaled = scale_traces(traces, 0.5)
    assert [(t.message, t.timestamp) for t in scaled] == [("a", 0.0), ("b", 1.0), ("c", 3.0)]


class FakeStream:
    """What the openai client's streamed chat completion yields: a first chunk with no text,
    pieces of text, a chunk with the finish reason, and the usage chunk."""

    def __init__(self, pieces: List[str], tokens: int) -> None:
        def delta(text: str | None) -> SimpleNamespace:
            choice = SimpleNamespace(delta=SimpleNamespace(content=text))
            return SimpleNamespace(choices=[choice], usage=None)

        usage = SimpleNamespace(choices=[], usage=SimpleNamespace(completion_tokens=tokens))
        self.chunks = [delta(""), *map(delta, pieces), delta(None), usage]

    def __aiter__(self) -> Any:
        return self._items()

    async def _items(self) -> Any:
        for chunk in self.chunks:
            await asyncio.sleep(0)
            yield chunk


def test_benchmark_one_times_each_piece_of_text_and_reads_the_usage() -> None:
    asked = {}

    async def create(**kwargs: Any) -> FakeStream:
        asked.update(kwargs)
        return FakeStream(["He", "llo", " world"], tokens=4)  # "llo world" were two tokens

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    result = asyncio.run(benchmark_one(client, "hi", 4, "m"))  # type: ignore[arg-type]
    assert len(result.tics) == 4 and result.tics == sorted(result.tics)  # sent + 3 pieces
    assert result.tokens == 4 and result.output_len == 4
    assert asked["stream"] and asked["max_tokens"] == 4 and asked["temperature"] == 0.0
    assert asked["extra_body"]["ignore_eos"] and asked["stream_options"]["include_usage"]


# ------------------------------------------------------------------ the timers
def test_perf_cpu_keeps_the_fastest_call() -> None:
    calls = []

    def f() -> None:
        calls.append(1)

    assert perf_cpu(f, repetitions=5) >= 0.0
    assert len(calls) == 6  # a warm-up and five timed calls
    with pytest.raises(ValueError):
        perf_cpu(f, repetitions=0)


def test_compare_memory_kernel_perf_reports_bandwidth() -> None:
    src = torch.randn(1 << 16)
    dst = torch.empty_like(src)
    base, ours = compare_memory_kernel_perf(
        baseline=lambda: dst.copy_(src), our_impl=lambda: dst.copy_(src),
        memory_footprint=2 * src.numel() * 4, extra_kwargs={"repetitions": 3},
    )  # fmt: skip
    assert base > 0 and ours > 0


# ------------------------------------------------------------------ a run, counted
def test_run_offline_counts_the_batches_and_the_radix_cache_shows(model_path) -> None:
    with LLM(str(model_path("tiny-qwen3")), dtype=torch.float32, page_size=4,
             num_page_override=256, max_running_req=4, cuda_graph_max_bs=0) as llm:  # fmt: skip
        prompts = [list(range(100, 140)) + [7 + i] for i in range(3)]
        params = [SamplingParams(max_tokens=5, ignore_eos=True)] * 3
        first = run_offline(llm, prompts, params)
        again = run_offline(llm, prompts, params)
        assert llm._forward.__func__ is LLM._forward  # the counting wrapper is gone
    assert first.output_tokens == 15 and first.prompt_tokens == 123
    assert first.prefill_batches == 1 and first.decode_batches == 4
    assert first.computed_prompt_tokens == 123
    assert again.computed_prompt_tokens == 3  # each prompt's last token: the rest is cached
    assert again.token_ids == first.token_ids
    assert first.throughput == pytest.approx(15 / first.seconds)


def test_an_eos_that_ends_an_ignore_eos_request_is_kept() -> None:
    """max_tokens reached on a token that is the EOS: with ignore_eos it is an ordinary token
    (before the fix, LLM.generate dropped it and returned one token short)."""
    llm = SimpleNamespace(eos_token_id=2, status_map={
        0: RequestStatus(uid=0, input_ids=[5], ignore_eos=True),
        1: RequestStatus(uid=1, input_ids=[5], ignore_eos=False),
    })  # fmt: skip
    send = LLM.offline_send_result
    send(llm, [DetokenizeMsg(0, 9, False), DetokenizeMsg(1, 9, False)])  # type: ignore[arg-type]
    send(llm, [DetokenizeMsg(0, 2, True), DetokenizeMsg(1, 2, True)])  # type: ignore[arg-type]
    assert llm.status_map[0].output_ids == [9, 2]
    assert llm.status_map[1].output_ids == [9]  # an EOS that stops a request is not output


# ------------------------------------------------------------------ the ablation's switch
def test_disable_custom_kernels_switches_to_the_references(monkeypatch) -> None:
    def no_kernel(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the kernel was built")

    monkeypatch.setattr(ENV.DISABLE_CUSTOM_KERNELS, "value", True)
    monkeypatch.setattr(store_module, "_jit_store_module", no_kernel)
    assert not use_custom_kernels(cuda=True) and not use_custom_kernels(cuda=False)
    assert flashinfer_for(torch.zeros(2, dtype=torch.bfloat16)) is None
    k_cache, v_cache = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    k, v = torch.randn(3, 8), torch.randn(3, 8)
    store_module.store_cache(k_cache, v_cache, torch.tensor([5, 0, 7]), k, v)
    assert torch.equal(k_cache[5].flatten(), k[0]) and torch.equal(v_cache[7].flatten(), v[2])


def test_the_ablation_adds_one_setting_per_row_and_ends_at_the_full_engine() -> None:
    from tools.bench_ablation import ablation_steps, settings_at

    steps = ablation_steps(gpu=True)
    assert [s.name for s in steps] == ["baseline", "fi", "graph", "overlap", "radix",
                                       "chunked", "kernels"]  # fmt: skip
    engine, env = settings_at(steps, 0)
    assert engine["cache_type"] == "naive" and env["MINISGL_DISABLE_OVERLAP_SCHEDULING"] == "1"
    engine, env = settings_at(steps, len(steps) - 1)
    # the last row is the engine as it is by default: every optimisation on
    assert engine == dict(attention_backend="torch" if not torch.cuda.is_available() else "fi",
                          cuda_graph_max_bs=0 if not torch.cuda.is_available() else 256,
                          cache_type="radix", max_extend_tokens=16384)  # fmt: skip
    assert set(env.values()) == {"0"}


def test_the_plots_are_svg_and_do_not_change_between_runs(tmp_path) -> None:
    from tools import plot_benchmarks

    data = tmp_path / "data"
    data.mkdir()
    curve = dict(points=[dict(batch=b, seconds=1.0, tokens=10 * b, decode_batches=9)
                         for b in (1, 2, 4)], prompt_len=8, new_tokens=10)  # fmt: skip
    (data / "ch21-batch-cpu.json").write_text(json.dumps(dict(curves={"full engine": curve})))
    split = dict(rows=[dict(batch=b, step_ms=3.0, parts={"attention": 1.0, "scheduler": 2.0})
                       for b in (1, 8)])  # fmt: skip
    (data / "ch21-split-cpu.json").write_text(json.dumps(split))
    first = [p.read_bytes() for p in (plot_benchmarks.plot_batch(data, tmp_path),
                                      plot_benchmarks.plot_split(data, tmp_path))]  # fmt: skip
    second = [p.read_bytes() for p in (plot_benchmarks.plot_batch(data, tmp_path),
                                       plot_benchmarks.plot_split(data, tmp_path))]  # fmt: skip
    assert first == second
    for svg in first:
        assert ET.fromstring(svg).tag.endswith("svg")
