"""Project P1: the host work of a step and the sampler, made cheaper without changing what
they compute; and the arithmetic of the workload's physical limit."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.attention.fi import gather_key_slots
from minisgl.core import Req, SamplingParams
from minisgl.engine import sample
from minisgl.env import ENV
from minisgl.scheduler import scheduler
from tools import bench_p1

CPU = torch.device("cpu")


@dataclass
class FakeReq:
    cached_len: int
    device_len: int
    max_device_len: int
    table_idx: int

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def can_decode(self) -> bool:
        return self.max_device_len > self.device_len


requests = st.lists(
    st.tuples(st.integers(0, 300), st.integers(1, 40), st.integers(0, 3), st.integers(0, 255)),
    min_size=1,
    max_size=24,
).map(lambda rows: [FakeReq(c, c + e, c + e + more, t) for c, e, more, t in rows])


@settings(max_examples=60, deadline=None)
@given(requests)
def test_a_steps_inputs_are_the_per_request_construction(reqs: List[FakeReq]) -> None:
    batch: Any = SimpleNamespace(padded_reqs=reqs, reqs=reqs)
    positions = scheduler._make_positions(batch, CPU)
    expected = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    assert positions.dtype == torch.int32 and torch.equal(positions, expected.to(torch.int32))
    batch.positions = positions
    slots, where = scheduler._make_input_tuple(batch, CPU)
    expected_slots = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
    assert slots.dtype == torch.int64 and torch.equal(slots, expected_slots)
    assert where.dtype == torch.int64 and torch.equal(where, expected)
    rows, columns = scheduler._make_write_tuple(batch, CPU)
    assert rows.tolist() == [r.table_idx for r in reqs]
    assert columns.tolist() == [r.device_len if r.can_decode else -1 for r in reqs]


class FakeKernels:
    """FlashInfer's sampling functions, recording their calls; draws are the argmax of the
    probabilities plus one, so that a test can tell them from a greedy row."""

    def __init__(self) -> None:
        self.calls: List[str] = []
        self.seen: Dict[str, Any] = {}

    def softmax(self, logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
        self.calls.append("softmax")
        self.seen["temperatures"] = temperatures
        return torch.softmax(logits / temperatures[:, None], dim=-1)

    def _draw(self, name: str, probs: torch.Tensor, *filters: Any) -> torch.Tensor:
        self.calls.append(name)
        self.seen[name] = filters
        return (probs.argmax(dim=-1) + 1).to(torch.int32)

    def sampling_from_probs(self, probs: torch.Tensor) -> torch.Tensor:
        return self._draw("sampling_from_probs", probs)

    def top_k_sampling_from_probs(self, probs: torch.Tensor, top_k: Any) -> torch.Tensor:
        return self._draw("top_k_sampling_from_probs", probs, top_k)

    def top_p_sampling_from_probs(self, probs: torch.Tensor, top_p: Any) -> torch.Tensor:
        return self._draw("top_p_sampling_from_probs", probs, top_p)

    def top_k_top_p_sampling_from_probs(self, probs: torch.Tensor, k: Any, p: Any) -> torch.Tensor:
        return self._draw("top_k_top_p_sampling_from_probs", probs, k, p)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 15), st.integers(1, 64)), min_size=1, max_size=20),
    st.integers(0, 2**31 - 1),
)
def test_the_key_slots_are_the_per_request_slices(rows_lengths: List, seed: int) -> None:
    page_table = torch.randint(0, 10**6, (16, 64), generator=torch.Generator().manual_seed(seed))
    page_table = page_table.to(torch.int32)
    rows, lengths = [r for r, _ in rows_lengths], [n for _, n in rows_lengths]
    slots = gather_key_slots(page_table, rows, lengths)
    expected = torch.cat([page_table[r, :n] for r, n in rows_lengths])  # chapter 17's way
    assert slots.dtype == torch.int32 and torch.equal(slots, expected)


def make_req(prompt: List[int], output_len: int = 8) -> Req:
    return Req(
        input_ids=torch.tensor(prompt, dtype=torch.int32),
        table_idx=0,
        cached_len=0,
        output_len=output_len,
        uid=0,
        sampling_params=SamplingParams(),
        cache_handle=None,  # type: ignore[arg-type]
    )


def test_tokens_appended_as_ints_join_the_prompt_when_read() -> None:
    req = make_req([5, 6, 7])
    for token in (8, 9):
        req.append_host(token)
    req.append_host(torch.tensor([10, 11], dtype=torch.int32))  # chapter 01's way still works
    assert req.host_len == 7 and len(req._new_ids) == 4  # nothing joined yet
    assert req.input_ids.dtype == torch.int32
    assert req.input_ids.tolist() == [5, 6, 7, 8, 9, 10, 11]
    assert req._new_ids == [] and req.host_len == 7  # joined once, by that read
    req.append_host(12)
    assert req.input_ids.tolist()[-2:] == [11, 12]
    req.input_ids = torch.tensor([1], dtype=torch.int32)  # assigning replaces everything
    assert req.host_len == 1 and req.input_ids.tolist() == [1]


def test_a_decode_batch_of_the_same_requests_reuses_the_sampling_tensors() -> None:
    sampler = sample.Sampler(CPU, vocab_size=100)
    reqs = [make_req([1, 2]) for _ in range(3)]
    for r, t in zip(reqs, (0.5, 0.7, 1.0)):
        r.sampling_params = SamplingParams(temperature=t, top_k=5)
    first = sampler.prepare(SimpleNamespace(reqs=list(reqs)))  # type: ignore[arg-type]
    again = sampler.prepare(SimpleNamespace(reqs=list(reqs)))  # type: ignore[arg-type]
    assert again is first
    fewer = sampler.prepare(SimpleNamespace(reqs=reqs[:2]))  # type: ignore[arg-type]
    assert fewer is not first and fewer.temperatures.tolist() == pytest.approx([0.5, 0.7])
    other = [make_req([1, 2]) for _ in range(3)]  # equal parameters, other requests
    assert sampler.prepare(SimpleNamespace(reqs=other)) is not fewer  # type: ignore[arg-type]


def sampling_batch(params: List[sample.SamplingParams] | List[Any]) -> Any:
    return SimpleNamespace(reqs=[SimpleNamespace(sampling_params=p) for p in params])


def params(**kwargs: Any) -> Any:
    from minisgl.core import SamplingParams

    return SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "top_k, top_p, kernel",
    [
        (-1, 1.0, "sampling_from_probs"),
        (5, 1.0, "top_k_sampling_from_probs"),
        (-1, 0.9, "top_p_sampling_from_probs"),
        (5, 0.9, "top_k_top_p_sampling_from_probs"),
    ],
)
def test_on_a_gpu_the_sampler_calls_flashinfers_kernels(
    top_k: int, top_p: float, kernel: str
) -> None:
    fake = FakeKernels()
    sampler = sample.Sampler(CPU, vocab_size=32)
    batch = sampling_batch([params(temperature=0.7, top_k=top_k, top_p=top_p)] * 3)
    args = sampler.prepare(batch)
    logits = torch.randn(3, 32)
    with mock.patch.object(sample, "sampling_kernels", return_value=fake):
        tokens = sampler.sample(logits, args)
    assert fake.calls == ["softmax", kernel]
    assert torch.equal(tokens, (logits.argmax(dim=-1) + 1).to(torch.int32))
    assert torch.allclose(fake.seen["temperatures"], torch.full((3,), 0.7))
    if top_k > 0:  # FlashInfer takes the top-k as int32
        assert (
            fake.seen[kernel][0].dtype == torch.int32 and fake.seen[kernel][0].tolist() == [5] * 3
        )


def test_greedy_rows_of_a_mixed_batch_take_the_argmax() -> None:
    fake = FakeKernels()
    sampler = sample.Sampler(CPU, vocab_size=32)
    mixed = [params(temperature=0.0), params(temperature=0.8), params(temperature=0.0)]
    args = sampler.prepare(sampling_batch(mixed))
    assert args.any_greedy
    logits = torch.randn(3, 32)
    with mock.patch.object(sample, "sampling_kernels", return_value=fake):
        tokens = sampler.sample(logits, args)
    greedy = logits.argmax(dim=-1)
    assert tokens.tolist() == [int(greedy[0]), int(greedy[1]) + 1, int(greedy[2])]


def test_a_batch_with_no_greedy_row_computes_no_argmax() -> None:
    sampler = sample.Sampler(CPU, vocab_size=32)
    args = sampler.prepare(sampling_batch([params(temperature=0.8)] * 4))
    assert not args.any_greedy
    with mock.patch.object(torch, "argmax", side_effect=AssertionError("argmax computed")):
        tokens = sampler.sample(torch.randn(4, 32), args)
    assert tokens.shape == (4,)


def test_flashinfer_samples_only_gpu_logits_and_obeys_the_switch(monkeypatch) -> None:
    monkeypatch.setattr(sample, "_flashinfer_sampling", lambda: "kernels")
    assert sample.sampling_kernels(torch.zeros(2, 4)) is None  # a CPU tensor
    on_gpu: Any = SimpleNamespace(is_cuda=True)
    assert sample.sampling_kernels(on_gpu) == "kernels"
    monkeypatch.setattr(ENV.DISABLE_CUSTOM_KERNELS, "value", True)
    assert sample.sampling_kernels(on_gpu) is None


# ------------------------------------------------------------- the Gumbel-max sampler
@pytest.mark.parametrize("temperature, other", [(0.6, 1.5), (1.5, 0.6)])
def test_the_gumbel_max_kernel_draws_from_the_softmax_at_the_rows_temperature(
    temperature: float, other: float
) -> None:
    """8,192 draws from 8 tokens in bfloat16, split over two blocks of the vocabulary: the
    counts fit softmax(logits / temperature) (chi-square below 30, 7 degrees of freedom:
    one chance in 10^4 to fail by bad luck, and the seed is fixed) and clearly do not fit
    the softmax at the other temperature. The main prints the same check."""
    own, wrong = bench_p1.gumbel_fit(temperature, other, CPU)
    assert own < 30
    assert wrong > 300


@pytest.mark.parametrize("rows_per_program", [1, 4])
def test_the_gumbel_max_kernels_greedy_rows_take_the_argmax_and_a_seed_repeats(
    rows_per_program: int,
) -> None:
    from minisgl.kernel.triton.sample import gumbel_max_sample

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(13, 300, generator=gen)
    greedy = torch.arange(13) % 3 == 0
    t = torch.where(greedy, sample.MIN_TEMPERATURE, 5.0)

    def draw(seed: int) -> torch.Tensor:
        return gumbel_max_sample(
            logits, t, sample.MIN_TEMPERATURE, seed, block=64, rows_per_program=rows_per_program
        )

    tokens = draw(1)
    assert tokens.dtype == torch.int32
    assert torch.equal(tokens[greedy].long(), logits[greedy].argmax(-1))
    assert torch.equal(draw(1), tokens)
    assert not torch.equal(draw(2)[~greedy], tokens[~greedy])  # 9 rows at temperature 5


def test_on_a_gpu_temperature_alone_samples_by_the_gumbel_kernel(monkeypatch) -> None:
    """Without top-k or top-p the sampler calls the kernel (here under Triton's interpreter),
    not FlashInfer, and a mixed batch's greedy rows come out of it as their argmax; with a
    filter FlashInfer samples, as before."""
    monkeypatch.setattr(sample, "gumbel_kernel_applies", lambda logits: True)
    sampler = sample.Sampler(CPU, vocab_size=32)
    mixed = [params(temperature=0.0), params(temperature=0.8), params(temperature=0.0)]
    logits = torch.randn(3, 32)
    with mock.patch.object(sample, "sampling_kernels", side_effect=AssertionError("FlashInfer")):
        tokens = sampler.sample(logits, sampler.prepare(sampling_batch(mixed)))
    assert tokens[[0, 2]].tolist() == logits[[0, 2]].argmax(-1).tolist()
    fake = FakeKernels()
    filtered = sampler.prepare(sampling_batch([params(temperature=0.8, top_k=5)] * 3))
    with mock.patch.object(sample, "sampling_kernels", return_value=fake):
        sampler.sample(logits, filtered)
    assert fake.calls == ["softmax", "top_k_sampling_from_probs"]


def test_the_gumbel_kernel_samples_only_gpu_logits_and_obeys_its_switches(monkeypatch) -> None:
    on_gpu: Any = SimpleNamespace(is_cuda=True)
    assert not sample.gumbel_kernel_applies(torch.zeros(2, 4))  # a CPU tensor
    assert sample.gumbel_kernel_applies(on_gpu)
    monkeypatch.setattr(ENV.GUMBEL_SAMPLING, "value", False)
    assert not sample.gumbel_kernel_applies(on_gpu)
    monkeypatch.setattr(ENV.GUMBEL_SAMPLING, "value", True)
    monkeypatch.setattr(ENV.DISABLE_CUSTOM_KERNELS, "value", True)
    assert not sample.gumbel_kernel_applies(on_gpu)


def test_both_engines_run_the_workload_with_the_same_settings() -> None:
    """The side-by-side runs compare engines, not settings: this engine's configuration and
    the official one's are upstream's bench.py's, graphs up to batch 256 included (the
    default would stop at 160 on a GPU with 80 GiB or less free, an H100)."""
    from tools.bench_gpu import CONFIGURATIONS, OFFICIAL_SETTINGS, WORKLOAD_SETTINGS

    assert {**WORKLOAD_SETTINGS, **CONFIGURATIONS["fi-graphs"][1]} == OFFICIAL_SETTINGS
    assert OFFICIAL_SETTINGS["cuda_graph_max_bs"] == 256


def test_the_profiles_count_the_books_triton_kernels_in_their_parts() -> None:
    """torch.profiler names a Triton kernel by its function: the profile's parts must know
    the book's own kernels, or they all land in "other kernels" (they did, on the H100)."""
    from minisgl.kernel.triton import (
        decode_attention,
        fused_moe,
        gate_up_silu,
        product_add_norm,
        qk_norm_rope,
        store,
    )
    from minisgl.kernel.triton import sample as sample_kernel
    from tools.bench_ablation import gpu_part

    expected = {
        decode_attention._decode_piece_kernel: "attention",
        decode_attention._decode_merge_kernel: "attention",
        qk_norm_rope._qk_norm_rope_kernel: "norms, SiLU, RoPE",
        store._store_kv_kernel: "KV store, embedding",
        fused_moe.fused_moe_kernel: "matrix products",
        gate_up_silu._gate_up_silu_kernel: "matrix products",  # its name says SiLU too
        product_add_norm._slice_products: "matrix products",
        product_add_norm._add_slices_rmsnorm: "norms, SiLU, RoPE",  # the slices' sum too
        sample_kernel._gumbel_max_kernel: "sampling",
    }
    assert {k.__name__: gpu_part(k.__name__) for k in expected} == {
        k.__name__: part for k, part in expected.items()
    }


# ------------------------------------------------------------------------- the limit
ONE = bench_p1.Hardware("a round machine", memory_bytes_per_s=1000.0, bf16_flops_per_s=1e6)


def test_the_limit_of_one_request_by_hand() -> None:
    shape = bench_p1.Shape(
        layer_weights=10, lm_head_weights=20, kv_bytes_per_token=4, attention_width=2,
        num_layers=3, itemsize=2,
    )  # fmt: skip
    result = bench_p1.limit(shape, prompt_lens=[5], output_lens=[3], hw=ONE)
    # prefill: 2*3*10*5 = 300 matrix FLOPs, 2*2*3*2*(5*6/2) = 360 attention, 2*20 = 40 head
    assert result.prefill_s == pytest.approx(700 / 1e6)
    # two decode steps attending to 6 then 7 tokens; each reads (3*10 + 20) * 2 = 100 bytes of
    # weights, and 4 bytes per token of keys and values; bytes outweigh the FLOPs here
    assert result.decode_steps == 2
    assert result.decode_weights_s == pytest.approx(200 / 1000)
    assert result.decode_kv_s == pytest.approx((6 + 7) * 4 / 1000)
    assert result.decode_s == pytest.approx(result.decode_weights_s + result.decode_kv_s)
    assert result.tokens_per_s == pytest.approx(3 / result.seconds)


def test_a_step_bound_by_arithmetic_counts_its_flops() -> None:
    shape = bench_p1.Shape(1000, 0, 0, 1, 1, 2)
    slow = bench_p1.Hardware("slow arithmetic", memory_bytes_per_s=1e12, bf16_flops_per_s=1.0)
    result = bench_p1.limit(shape, prompt_lens=[1, 1], output_lens=[2, 2], hw=slow)
    # one step of two tokens: 2 * 1000 * 2 matrix FLOPs and 2 * 2 * 1 * 1 * (2 + 2) attention
    assert result.decode_s == pytest.approx(4000 + 16)


def test_the_shape_counts_every_weight_of_qwen3_0_6b() -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from tools.bench_gpu import QWEN3_0_6B

    shape = bench_p1.Shape.from_config(QWEN3_0_6B)
    config = Qwen3Config(**{k: v for k, v in QWEN3_0_6B.items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    matrices = sum(
        p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "layers." in name
    )
    assert shape.num_layers * shape.layer_weights == matrices
    assert shape.lm_head_weights == model.get_output_embeddings().weight.numel()
    assert shape.kv_bytes_per_token == 114_688  # chapter 22's number
    # `matmuls` times these: the same matrices, q/k/v and gate/up merged as the engine loads them
    products = bench_p1.decode_products(QWEN3_0_6B)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    width = lambda *linears: sum(m.out_features for m in linears)  # noqa: E731
    assert products["qkv"] == (1024, width(attn.q_proj, attn.k_proj, attn.v_proj))
    assert products["o"] == (attn.o_proj.in_features, attn.o_proj.out_features)
    assert products["gate_up"] == (1024, width(mlp.gate_proj, mlp.up_proj))
    assert products["down"] == (mlp.down_proj.in_features, mlp.down_proj.out_features)
    layer = sum(k * n for name, (k, n) in products.items() if name != "lm_head")
    assert layer == shape.layer_weights
    assert products["lm_head"][0] * products["lm_head"][1] == shape.lm_head_weights
    assert [bench_p1.graph_batch(b, [1, 2, 4, 8, 16]) for b in (1, 3, 8, 9)] == [1, 4, 8, 16]


@pytest.mark.parametrize("rows", [1, 17])
def test_the_split_k_product_is_f_linears(rows: int) -> None:
    """`bench_p1.py split-k`'s candidate, in Triton's interpreter and float32 (its bfloat16
    tl.dot is wrong there): the settings the benchmark tries that fit o's and down's shapes,
    with tiles of 32 and 128 outputs, on a smaller matrix of the same kind (few outputs, a long
    sum)."""
    import torch.nn.functional as F

    from tools.bench_gpu import QWEN3_0_6B
    from tools.split_k import split_k_linear

    gen = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 512, generator=gen), torch.randn(128, 512, generator=gen)
    expected = F.linear(x, weight)
    shapes = [s for n, s in bench_p1.decode_products(QWEN3_0_6B).items() if n in ("o", "down")]
    tried = 0
    for split, block_n, block_k in bench_p1.SPLIT_K_SETTINGS:
        if any(k % (split * block_k) for k, _ in shapes) or 512 % (split * block_k):
            continue
        if block_n == 64:
            continue  # the smallest and largest tiles are enough (the interpreter is slow)
        got = split_k_linear(x, weight, split, block_n, block_k)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
        tried += 1
    assert tried == 10
    with pytest.raises(AssertionError):
        split_k_linear(x, weight, 3, 32, 64)  # 512 inputs do not cut into 3 slices of 64s


@pytest.mark.parametrize("block_m", [None, 16])
def test_the_split_k_product_takes_its_rows_in_tiles(block_m) -> None:
    import torch.nn.functional as F

    from tools.split_k import split_k_linear

    gen = torch.Generator().manual_seed(40)
    x, weight = torch.randn(40, 512, generator=gen), torch.randn(128, 512, generator=gen)
    got = split_k_linear(x, weight, 2, 32, 64, block_m=block_m)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_split_k_norm_tries_row_tiles_from_a_quarter_of_the_batch_to_all_of_it() -> None:
    settings = {b: bench_p1.split_k_norm_settings(b) for b in (1, 24, 120, 256)}
    assert {s[1] for s in settings[1]} == {16}
    assert {s[1] for s in settings[24]} == {16, 32}
    assert {s[1] for s in settings[120]} == {32, 64, 128}
    assert {s[1] for s in settings[256]} == {64, 128}
    assert len(settings[256]) == 4 * 2 * 3 * 2  # slices, rows, outputs, inputs


def test_the_workload_limit_covers_upstreams_requests() -> None:
    from minisgl.benchmark.offline import make_offline_workload

    work = make_offline_workload()
    result = bench_p1.workload_limit()
    assert result.output_tokens == sum(p.max_tokens for p in work.sampling_params)
    assert result.decode_steps == max(p.max_tokens for p in work.sampling_params) - 1
    assert 0 < result.prefill_s < result.decode_s


def test_the_batch_sweeps_limit_is_the_limit_of_each_sizes_requests() -> None:
    """`bench_p1.py batch` puts every size's measured rate beside that size's own limit: b
    requests of the sweep's prompt and output lengths, all at once. The limit grows with the
    batch (the weights are shared) but less than in proportion (each request reads its keys)."""
    from tools.bench_gpu import QWEN3_0_6B

    jobs = bench_p1.batch_jobs([1, 4])
    assert [len(j["prompts"]) for j in jobs] == [1, 4]
    assert {len(p) for j in jobs for p in j["prompts"]} == {bench_p1.BATCH_PROMPT}
    assert all(0 <= t <= 10000 for j in jobs for p in j["prompts"] for t in p)
    assert jobs[1]["new_tokens"] == [bench_p1.BATCH_NEW] * 4
    assert bench_p1.batch_jobs([4]) == jobs[1:]  # seeded by the size: the same prompts again
    again = bench_p1.batch_jobs([4], round=1)[0]["prompts"]  # but not in the next round
    assert not {tuple(p) for p in again} & {tuple(p) for p in jobs[1]["prompts"]}
    limits = bench_p1.batch_limits(bench_p1.H200)
    shape = bench_p1.Shape.from_config(QWEN3_0_6B)
    one = bench_p1.limit(shape, [bench_p1.BATCH_PROMPT], [bench_p1.BATCH_NEW], bench_p1.H200)
    assert limits[0] == dict(batch=1, seconds=one.seconds, tokens_per_s=one.tokens_per_s)
    rates = [x["tokens_per_s"] for x in limits]
    assert rates == sorted(rates)
    assert rates[-1] < 256 * rates[0]
    data = dict(
        curves={"ours": [dict(batch=x["batch"], tokens=x["batch"] * 256, seconds=1.0)
                         for x in limits]},
        limit=limits, prompt_len=256, new_tokens=256, repeat=2, hardware="H", machine="M",
    )  # fmt: skip
    table = bench_p1.batch_table(data)
    assert f"| 1 | 256 | {rates[0]:,.0f} | {256 / rates[0]:.0%} |" in table


def test_a_runs_step_time_is_its_wall_time_over_its_forward_steps() -> None:
    """Where the runs counted their forward steps, the table adds the mean milliseconds per
    step, says how many steps the runs made, and compares with the engine it is told."""
    runs = {
        "this engine": [dict(tokens=2000, seconds=1.0, prefill_steps=2, decode_steps=98)] * 2,
        "without x": [dict(tokens=2000, seconds=1.25, prefill_steps=2, decode_steps=98)],
        "official": [dict(tokens=2000, seconds=1.1, prefill_steps=3, decode_steps=99)],
    }
    with mock.patch("torch.cuda.get_device_name", lambda: "a GPU"):
        table = bench_p1.runs_table(runs, bench_p1.workload_limit(), "", base="this engine")
    assert "| this engine | 2,000, 2,000 | 2,000 | 0.0% | 5% | 10.00 |" in table
    assert "| without x | 1,600 | 1,600 | 0.0% | 4% | 12.50 |" in table
    assert "Ratios to this engine: without x 0.800; official 0.909." in table
    assert "the runs made 2 + 98 to 3 + 99 prefill + decode steps" in table


def test_timed_jobs_counts_each_jobs_tokens_and_the_steps_are_counted(
    model_path, monkeypatch
) -> None:
    from minisgl.engine.engine import Engine
    from minisgl.llm import LLM
    from tools.bench_gpu import StepCounter, timed_jobs

    monkeypatch.setattr(Engine, "forward_batch", Engine.forward_batch)  # put back afterwards
    steps = StepCounter()
    llm = LLM(str(model_path("tiny-qwen3")), dtype=torch.float32, page_size=4,
              num_page_override=256, max_running_req=4, cuda_graph_max_bs=0)  # fmt: skip
    jobs = [
        dict(prompts=[[5, 6, 7]], new_tokens=[3]),
        dict(prompts=[[8, 9], [10]], new_tokens=[2, 4]),
    ]
    results = timed_jobs(llm, jobs)
    assert [(r["batch"], r["tokens"]) for r in results] == [(1, 3), (2, 6)]
    assert all(r["seconds"] > 0 for r in results)
    # job one: a prefill and 2 decode steps; job two: one prefill of both, then 3 decode steps
    assert (steps.prefill, steps.decode) == (2, 5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_sampler_gets_the_models_dtype_from_graphs_and_eager_steps(
    model_path, dtype: torch.dtype
) -> None:
    """The graphs' logits buffer has the model's dtype: a bfloat16 model's graphs hand the
    sampler bfloat16 logits, as its eager steps do, not a float32 copy of twice the bytes."""
    from minisgl.llm import LLM

    seen: List[torch.dtype] = []  # the dtype of every step's logits, as the sampler gets them
    graphs: List[int] = []  # the batch size of every replay
    with LLM(str(model_path("tiny-qwen3")), dtype=dtype, attention_backend="torch", page_size=4,
             num_page_override=64, max_running_req=4, cuda_graph_bs=[1, 2]) as llm:  # fmt: skip
        runner = llm.engine.graph_runner
        assert runner.buffer.logits.dtype == dtype
        sample, replay = llm.engine.sampler.sample, runner.replay
        llm.engine.sampler.sample = lambda logits, args: (
            seen.append(logits.dtype) or sample(logits, args)
        )  # type: ignore[method-assign]
        runner.replay = lambda batch: graphs.append(batch.size) or replay(batch)  # type: ignore
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        llm.generate([[5, 6, 7], [8, 9]], [params, params])
    assert graphs == [2, 2, 2]  # one prefill step, then 3 decode steps through the graph of 2
    assert seen == [dtype] * 4


# ------------------------------------------------- q/k norms and RoPE in one Triton kernel
def _qkv_case(dtype: torch.dtype, seed: int = 0):
    """A qkv output of 7 tokens (6 query heads, 3 key/value heads of 32: head counts that are
    not powers of two), both norms' weights, positions up to the table's last row."""
    from minisgl.layers import RMSNorm
    from minisgl.models import RotaryConfig

    g = torch.Generator().manual_seed(seed)
    q_norm, k_norm = RMSNorm(32, 1e-6), RMSNorm(32, 1e-6)
    q_norm.weight = (torch.rand(32, generator=g) + 0.5).to(dtype)
    k_norm.weight = (torch.rand(32, generator=g) + 0.5).to(dtype)
    rope = RotaryConfig(head_dim=32, rotary_dim=32, max_position=64, base=10000.0, scaling=None)
    qkv = (3 * torch.randn(7, (6 + 2 * 3) * 32, generator=g)).to(dtype)
    positions = torch.tensor([0, 5, 1, 63, 7, 2, 30])
    return qkv, q_norm, k_norm, rope, positions


# the slots of _qkv_case's 7 tokens in a pool of 6 pages of 4 slots
POOL_SLOTS = torch.tensor([9, 3, 17, 0, 12, 5, 20], dtype=torch.int32)


def _attention_inputs(
    qkv, q_norm, k_norm, rope, positions, fused: bool, monkeypatch, store: bool = False
):
    """What AttentionLayer.forward hands the backend (q, k, v), with the fused kernel or
    with the three steps, and the KV pool after the backend stored what it was handed (as
    "k_pool" and "v_pool": [24 slots, 3 heads * 32], never-written slots NaN); the kernel is
    made to apply on this CPU as it would on a GPU, and to store k and v too if `store`."""
    from minisgl.kernel.store import store_cache_reference
    from minisgl.layers import attention

    seen: Dict[str, Any] = {}
    pool = torch.full((2, 6, 4, 3, 32), float("nan"), dtype=qkv.dtype)

    def backend_forward(q, k, v, layer_id, batch):
        assert layer_id == 0
        if k is not None:  # as every backend does: store what the layer handed over
            store_cache_reference(pool[0].view(24, 3, 32), pool[1].view(24, 3, 32),
                                  batch.out_loc, k, v)  # fmt: skip
        seen.update(q=q.clone(), k=None if k is None else k.clone(),
                    v=None if v is None else v.clone())  # fmt: skip
        return q

    kv_cache = SimpleNamespace(
        dtype=qkv.dtype, k_cache=lambda i: pool[0], v_cache=lambda i: pool[1]
    )
    ctx = SimpleNamespace(batch=SimpleNamespace(positions=positions, out_loc=POOL_SLOTS),
                          attn_backend=SimpleNamespace(forward=backend_forward),
                          kv_cache=kv_cache)  # fmt: skip
    monkeypatch.setattr(attention, "get_global_ctx", lambda: ctx)
    monkeypatch.setattr(attention, "flashinfer_for", lambda x: "kernels" if fused else None)
    monkeypatch.setattr(ENV.FUSED_QK_NORM_ROPE, "value", fused)
    monkeypatch.setattr(ENV.FUSED_KV_STORE, "value", store)
    layer = attention.AttentionLayer(0, 6, 3, 32, rope, q_norm, k_norm)
    monkeypatch.setattr(layer.q_norm, "forward_inplace",  # the PyTorch code, not FlashInfer's
                        lambda x: x.copy_(attention_norm(x, q_norm)))  # fmt: skip
    monkeypatch.setattr(layer.k_norm, "forward_inplace",
                        lambda x: x.copy_(attention_norm(x, k_norm)))  # fmt: skip
    layer.forward(qkv.clone())
    seen.update(k_pool=pool[0].view(24, 96), v_pool=pool[1].view(24, 96))
    return seen


def attention_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    from minisgl.layers.norm import rms_norm

    return rms_norm(x, norm.weight, norm.eps)


def test_the_fused_kernel_computes_the_norms_and_rope_of_the_three_steps(monkeypatch) -> None:
    """float32: the attention layer hands the backend the same q and k (to rounding) whether
    one Triton kernel or the norms and RoPE did the work, and v untouched."""
    case = _qkv_case(torch.float32)
    three = _attention_inputs(*case, fused=False, monkeypatch=monkeypatch)
    one = _attention_inputs(*case, fused=True, monkeypatch=monkeypatch)
    torch.testing.assert_close(one["q"], three["q"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(one["k"], three["k"], rtol=1e-6, atol=1e-6)
    assert torch.equal(one["v"], three["v"]) and torch.equal(one["v"], case[0][:, -3 * 32 :])
    assert not torch.equal(one["q"].flatten(1), case[0][:, : 6 * 32])  # it did change q


def test_the_fused_kernel_stores_what_the_backend_would_have_stored(monkeypatch) -> None:
    """float32: with the store, the layer hands the backend no k or v, and the pool holds at
    the batch's slots the keys and values that the three steps and the backend's store put
    there (to rounding), every other slot untouched; q is the same."""
    case = _qkv_case(torch.float32, seed=2)
    three = _attention_inputs(*case, fused=False, monkeypatch=monkeypatch)
    fused = _attention_inputs(*case, fused=True, monkeypatch=monkeypatch, store=True)
    assert fused["k"] is None and fused["v"] is None and three["k"] is not None
    torch.testing.assert_close(fused["q"], three["q"], rtol=1e-6, atol=1e-6)
    written = torch.zeros(24, dtype=torch.bool)
    written[POOL_SLOTS.long()] = True
    for name in ("k_pool", "v_pool"):
        assert fused[name][~written].isnan().all() and not fused[name][written].isnan().any()
        torch.testing.assert_close(fused[name], three[name], rtol=1e-6, atol=1e-6, equal_nan=True)
    assert torch.equal(fused["v_pool"][POOL_SLOTS.long()], case[0][:, -3 * 32 :])


def test_in_16_bits_the_stored_keys_are_the_bits_the_kernel_writes_in_place() -> None:
    """bfloat16: storing from the kernel rounds nothing more: the pool's rows are, bit for bit,
    what the kernel writes into the qkv output without the store, then copied by the store."""
    from minisgl.kernel.store import store_cache_reference
    from minisgl.kernel.triton.qk_norm_rope import KVStore, qk_norm_rope_triton
    from minisgl.layers.rotary import RotaryEmbedding

    qkv, q_norm, k_norm, _, positions = _qkv_case(torch.bfloat16, seed=3)
    table = RotaryEmbedding(32, 32, 64, 10000.0)._cos_sin_cache
    weights = (q_norm.weight, k_norm.weight, 1e-6, positions, table, 32)
    pools = [torch.zeros(2, 24, 96, dtype=torch.bfloat16) for _ in range(2)]
    outputs = [qkv.clone() for _ in range(2)]
    q, k, v = outputs[0].split([6 * 32, 3 * 32, 3 * 32], dim=-1)
    qk_norm_rope_triton(q, k, *weights)
    store_cache_reference(pools[0][0], pools[0][1], POOL_SLOTS, k, v)
    q, k, v = outputs[1].split([6 * 32, 3 * 32, 3 * 32], dim=-1)
    qk_norm_rope_triton(q, k, *weights, KVStore(pools[1][0], pools[1][1], POOL_SLOTS, v))
    assert torch.equal(pools[0], pools[1]) and pools[1][:, POOL_SLOTS.long()].ne(0).any(-1).all()
    assert torch.equal(outputs[0][:, : 6 * 32], outputs[1][:, : 6 * 32])  # the same q
    assert torch.equal(outputs[1][:, 6 * 32 :], qkv[:, 6 * 32 :])  # k and v left as they were


def test_the_fused_store_needs_a_pool_of_the_kernels_dtype(monkeypatch) -> None:
    """On by default (MINISGL_FUSED_KV_STORE=0 turns it off); a pool in another dtype than the
    layer's k and v (the kernel writes its own dtype) leaves the store to the backend."""
    from minisgl.layers import attention

    assert ENV.FUSED_KV_STORE.value is True
    case = _qkv_case(torch.bfloat16)
    layer = attention.AttentionLayer(0, 6, 3, 32, case[3], case[1], case[2])
    v = case[0][:, -3 * 32 :]
    pool = torch.zeros(2, 6, 4, 3, 32, dtype=torch.bfloat16)
    ctx = SimpleNamespace(batch=SimpleNamespace(out_loc=POOL_SLOTS), kv_cache=SimpleNamespace(
        dtype=torch.bfloat16, k_cache=lambda i: pool[0], v_cache=lambda i: pool[1]))  # fmt: skip
    monkeypatch.setattr(attention, "get_global_ctx", lambda: ctx)
    store = layer._kv_store(v)
    assert store is not None and store.k_pool.shape == (24, 96) and store.slots is POOL_SLOTS
    assert store.k_pool.data_ptr() == pool[0].data_ptr() and store.v is v
    ctx.kv_cache.dtype = torch.float8_e4m3fn
    assert layer._kv_store(v) is None
    ctx.kv_cache.dtype = torch.bfloat16
    monkeypatch.setattr(ENV.FUSED_KV_STORE, "value", False)
    assert layer._kv_store(v) is None


def test_in_16_bits_the_fused_kernel_rounds_once() -> None:
    """bfloat16: the kernel's result is the float32 arithmetic on the same inputs, rounded
    once (the three steps round after each), so within one bfloat16 step of it (on a GPU half
    a step: Triton's CPU interpreter truncates where the GPU rounds to nearest)."""
    from minisgl.kernel.triton.qk_norm_rope import qk_norm_rope_triton
    from minisgl.layers.rotary import RotaryEmbedding

    qkv, q_norm, k_norm, rope, positions = _qkv_case(torch.bfloat16, seed=1)
    table = RotaryEmbedding(32, 32, 64, 10000.0)._cos_sin_cache
    exact = qkv.float()
    q, k, _ = exact.split([6 * 32, 3 * 32, 3 * 32], dim=-1)
    for x, norm, heads in ((q, q_norm, 6), (k, k_norm, 3)):
        view = x.view(7, heads, 32)
        weight = norm.weight.float()
        view.copy_(view * torch.rsqrt(view.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)
    RotaryEmbedding(32, 32, 64, 10000.0).forward(positions, q, k)
    ours = qkv.clone()
    q, k, _ = ours.split([6 * 32, 3 * 32, 3 * 32], dim=-1)
    qk_norm_rope_triton(q, k, q_norm.weight, k_norm.weight, 1e-6, positions, table, 32)
    step = exact.abs().clamp(min=2**-6) * 2**-7  # one bfloat16 step at each value's size
    assert ((ours.float() - exact).abs() <= step).all()
    assert torch.equal(ours[:, 9 * 32 :], qkv[:, 9 * 32 :])  # v untouched


def test_the_fused_kernel_runs_on_a_gpu_unless_turned_off(monkeypatch) -> None:
    from minisgl.layers import attention

    def default(**env: str) -> str:  # the setting as a fresh process reads it
        code = "from minisgl.env import ENV; print(ENV.FUSED_QK_NORM_ROPE)"
        environ = {k: v for k, v in os.environ.items() if k != "MINISGL_FUSED_QK_NORM_ROPE"}
        return subprocess.run([sys.executable, "-c", code], env={**environ, **env},
                              capture_output=True, text=True, timeout=60,
                              cwd=Path(__file__).parents[1]).stdout.strip()  # fmt: skip

    assert default() == "True" and default(MINISGL_FUSED_QK_NORM_ROPE="0") == "False"
    case = _qkv_case(torch.bfloat16)
    layer = attention.AttentionLayer(0, 6, 3, 32, case[3], case[1], case[2])
    monkeypatch.setattr(ENV.FUSED_QK_NORM_ROPE, "value", True)
    assert not layer._fused_norms_and_rope(case[0])  # a CPU tensor: the PyTorch code runs
    monkeypatch.setattr(attention, "flashinfer_for", lambda x: "kernels")
    assert layer._fused_norms_and_rope(case[0])  # as on a GPU in 16 bits
    monkeypatch.setattr(ENV.FUSED_QK_NORM_ROPE, "value", False)  # MINISGL_FUSED_QK_NORM_ROPE=0
    assert not layer._fused_norms_and_rope(case[0])
    monkeypatch.setattr(ENV.FUSED_QK_NORM_ROPE, "value", True)
    layer.k_norm = None  # a model without q/k norms (Llama) keeps RoPE alone
    assert not layer._fused_norms_and_rope(case[0])


def test_a_variants_settings_may_hold_commas() -> None:
    """`side --variant "LABEL:NAME=VALUE,..."`: a part whose name is not in capitals continues
    the value before it (the decode kernel's settings are themselves a list)."""
    env = bench_p1.variant_environment(
        "MINISGL_GUMBEL_SAMPLING=0,MINISGL_TRITON_DECODE_SETTINGS=page_loop=1,block_n=32,A_B=x=y"
    )
    assert env == {
        "MINISGL_GUMBEL_SAMPLING": "0",
        "MINISGL_TRITON_DECODE_SETTINGS": "page_loop=1,block_n=32",
        "A_B": "x=y",
    }


def test_the_side_table_compares_every_engine_with_the_last() -> None:
    """`bench_p1.py side --variant ...` runs this engine with and without a setting beside the
    official one: each gets its ratio to the official engine, the last in the table."""
    runs = {
        "this engine": [{"tokens": 2100, "seconds": 0.1}, {"tokens": 2300, "seconds": 0.1}],
        "this engine, fused": [{"tokens": 2420, "seconds": 0.1}],
        "official": [{"tokens": 2000, "seconds": 0.1}],
    }
    with mock.patch("torch.cuda.get_device_name", lambda: "a GPU"):
        table = bench_p1.runs_table(runs, bench_p1.workload_limit(), "Ratio this / official")
        two = bench_p1.runs_table(
            {k: runs[k] for k in ("this engine", "official")}, bench_p1.workload_limit(), "R"
        )
    assert "| this engine | 21,000, 23,000 | 22,000 | 9.1% |" in table
    assert "Ratios to official: this engine 1.100; this engine, fused 1.210." in table
    assert "\nR: 1.100." in two


@pytest.mark.parametrize(
    "merge_here, equal, page_size, tma, narrow_parts, page_loop, heads_first, kv_layout",
    [
        (True, False, 1, False, False, False, False, "NHD"),
        (False, False, 1, False, False, False, False, "NHD"),
        (False, False, 1, False, True, False, False, "NHD"),
        (True, True, 1, False, True, False, True, "NHD"),
        (False, False, 32, False, False, False, False, "NHD"),
        (True, True, 32, False, False, False, False, "NHD"),
        (False, False, 32, True, False, False, False, "NHD"),
        (True, True, 32, True, False, False, True, "NHD"),
        (False, False, 32, False, False, True, True, "NHD"),
        (True, True, 32, False, True, True, False, "NHD"),
        (False, False, 32, True, False, True, False, "NHD"),
        (False, False, 32, False, False, False, False, "HND"),
        (True, True, 32, False, True, False, True, "HND"),
        (False, True, 32, True, False, False, False, "HND"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chunked_decode_kernel_is_softmax_attention_over_each_requests_keys(
    monkeypatch,
    dtype,
    merge_here,
    equal,
    page_size,
    tma,
    narrow_parts,
    page_loop,
    heads_first,
    kv_layout,
) -> None:
    """The Triton decode kernel (chunks of at least 16 keys, at most 4 per request and head,
    merged by the last piece to finish or by a second kernel; pieces of equal size or a
    remainder last) against softmax attention
    written out in float32, for ragged lengths: one key, fewer than a chunk, exactly one
    chunk, and more keys than 4 chunks hold (longer pieces); two query heads per key/value
    head. Keys at scattered slots, or in whole pages of 32 slots taken in a random order (the
    kernel then reads one index per 16 keys, and with TMA whole tiles; the cache's unused
    slots hold NaN, which must not reach the output; with the page loop, an index per page,
    pieces that start and end inside a page included). The pieces' results are kept in
    float32 or in the output's dtype. The grid's first axis is the request or (heads_first) the
    key/value head. The caches are [slots, kv heads, head_dim], or (HND) the same pages as
    [pages, kv heads, page size, head_dim]. The kernel's new buffers start as NaN, so an output
    row left unwritten, or a merge that reads a piece never written (requests of one piece write
    their output and skip the merge), would show. The counters of finished pieces end at zero."""
    from minisgl.kernel.triton import decode_attention
    from minisgl.kernel.triton.decode_attention import decode_attention_triton

    gen = torch.Generator().manual_seed(0)
    lengths, q_heads, kv_heads, head_dim = [1, 5, 16, 37, 64, 300], 4, 2, 32
    k = torch.randn(600, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(600, kv_heads, head_dim, generator=gen).to(dtype)
    unused = torch.ones(600, dtype=torch.bool)
    q = torch.randn(len(lengths), q_heads, head_dim, generator=gen).to(dtype)
    if page_size == 1:
        indices = torch.randperm(600, generator=gen)[: sum(lengths)].to(torch.int32)
    else:  # each request's pages, whole, from a shuffled list of the 18 pages
        pages = torch.randperm(600 // page_size, generator=gen).tolist()
        indices = torch.cat([
            (torch.tensor([pages.pop() for _ in range(-(-n // page_size))])[:, None] * page_size
             + torch.arange(page_size)).view(-1)[:n]
            for n in lengths
        ]).to(torch.int32)  # fmt: skip
    indptr = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    unused[indices.long()] = False
    k[unused], v[unused] = float("nan"), float("nan")

    def nan_filled(make: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def make_nan(*args: Any, **kwargs: Any) -> torch.Tensor:
            made = make(*args, **kwargs)
            return made.fill_(float("nan")) if made.is_floating_point() else made

        return make_nan

    monkeypatch.setattr(torch.Tensor, "new_empty", nan_filled(torch.Tensor.new_empty))
    monkeypatch.setattr(torch, "empty_like", nan_filled(torch.empty_like))
    caches = (k, v)
    if kv_layout == "HND":  # the same slots: page s // 32, token s % 32 in it
        caches = tuple(c[: 600 // page_size * page_size].view(-1, page_size, kv_heads, head_dim)
                       .transpose(1, 2).contiguous() for c in caches)  # fmt: skip
    out = decode_attention_triton(
        q, *caches, indptr, indices, splits=4, chunk=16, block_n=16, merge_here=merge_here,
        equal=equal, page_size=page_size, tma=tma, narrow_parts=narrow_parts,
        page_loop=page_loop, heads_first=heads_first, kv_layout=kv_layout,
    )  # fmt: skip
    monkeypatch.undo()
    assert not decode_attention._COUNTERS[q.device].any()
    for r in range(len(lengths)):
        slots = indices[indptr[r] : indptr[r + 1]].long()
        keys = k[slots].float().repeat_interleave(2, dim=1)
        values = v[slots].float().repeat_interleave(2, dim=1)
        scores = torch.einsum("hd,thd->ht", q[r].float(), keys) * head_dim**-0.5
        expected = torch.einsum("ht,thd->hd", scores.softmax(-1), values)
        if dtype == torch.float32:
            torch.testing.assert_close(out[r], expected, rtol=1e-5, atol=1e-5)
        else:  # the weights meet the values in bfloat16, the output is rounded once more
            torch.testing.assert_close(out[r].float(), expected, rtol=0, atol=2e-2)


def test_the_kernel_tables_column_for_the_engine_is_the_engines_settings() -> None:
    """`decode-kernels` and `counters` time "the engine's" column with the settings the
    backend gives the kernel (fi.py's, the workload's pages of 256 where page_runs is on), and
    every one of them is a parameter of the kernel's function."""
    import inspect

    from minisgl.attention.fi import TRITON_DECODE_SETTINGS
    from minisgl.kernel.triton.decode_attention import decode_attention_triton

    settings = bench_p1.engine_decode_settings()
    assert settings.pop("page_size") == (256 if TRITON_DECODE_SETTINGS["page_runs"] else 1)
    assert settings == {k: v for k, v in TRITON_DECODE_SETTINGS.items() if k != "page_runs"}
    parameters = inspect.signature(decode_attention_triton).parameters
    assert set(settings) | {"page_size"} <= set(parameters)


def test_the_decode_kernels_settings_from_the_environment() -> None:
    """MINISGL_TRITON_DECODE_SETTINGS: integers by name; text that is not NAME=VALUE is
    refused (and the setting keeps its default, as every MINISGL_* setting does)."""
    from minisgl.env import _to_settings

    assert _to_settings("equal=1, merge_here=1,") == {"equal": 1, "merge_here": 1}
    assert _to_settings("splits=16;chunk=128") == {"splits": 16, "chunk": 128}
    assert _to_settings("") == {}
    for bad in ("equal", "splits=eight"):
        with pytest.raises(ValueError):
            _to_settings(bad)


@pytest.mark.parametrize("page_size, overrides, expected", [
    (256, {}, 256), (1, {}, 1), (256, {"page_runs": 0}, 1),
])  # fmt: skip
def test_the_decode_kernel_reads_one_index_per_load_only_with_the_engines_pages(
    monkeypatch, page_size: int, overrides: Dict[str, int], expected: int
) -> None:
    """The backend tells the kernel the engine's page size (one index per 64 keys where the
    pages hold whole loads), unless MINISGL_TRITON_DECODE_SETTINGS says page_runs=0; the kernel
    is then told pages of one slot, and reads every key's slot."""
    from minisgl.attention.fi import FlashInferBackend
    from minisgl.core import Context, clear_global_ctx, set_global_ctx

    monkeypatch.setattr(ENV, "TRITON_DECODE_SETTINGS", SimpleNamespace(value=overrides))
    clear_global_ctx()
    set_global_ctx(Context(page_size=page_size))
    try:
        settings = FlashInferBackend.triton_decode_settings.func(SimpleNamespace())
    finally:
        clear_global_ctx()
    assert settings["page_size"] == expected and "page_runs" not in settings
    assert settings["block_n"] == 64 and settings["splits"] == 8
    assert not settings["narrow_parts"]  # float32 pieces: bfloat16 ones were slower on an H100
    assert settings["pdl"] is False  # MINISGL_TRITON_PDL=1 asks for it


def test_programmatic_dependent_launch_is_off_unless_asked(monkeypatch) -> None:
    """MINISGL_TRITON_PDL=1 gives the decode kernels `pdl` (the norms kernel reads the same
    switch); a decode setting of that name overrides it, as any other."""
    from minisgl.attention.fi import FlashInferBackend
    from minisgl.core import Context, clear_global_ctx, set_global_ctx

    clear_global_ctx()
    set_global_ctx(Context(page_size=256))
    try:
        settings = FlashInferBackend.triton_decode_settings.func
        assert settings(SimpleNamespace())["pdl"] is False
        monkeypatch.setattr(ENV.TRITON_PDL, "value", True)
        assert settings(SimpleNamespace())["pdl"] is True
        monkeypatch.setattr(ENV, "TRITON_DECODE_SETTINGS", SimpleNamespace(value={"pdl": 0}))
        assert not settings(SimpleNamespace())["pdl"]
    finally:
        clear_global_ctx()


@pytest.mark.parametrize("rows", [1, 5, 17, 40])
def test_the_gate_up_kernel_is_silu_of_the_gate_times_the_up_product(rows: int) -> None:
    """In Triton's interpreter and float32 (exact products): the table's tile for these rows
    and a smaller one, on a weight whose sizes are no multiple of the tiles (masked edges)."""
    import torch.nn.functional as F

    from minisgl.kernel.triton.gate_up_silu import GateUpTile, gate_up_silu_triton, gate_up_tile

    gen = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 100, generator=gen), torch.randn(2 * 40, 100, generator=gen)
    expected = F.silu(F.linear(x, weight[:40])) * F.linear(x, weight[40:])
    for tile in (gate_up_tile(rows), GateUpTile(block_m=16, block_n=16, block_k=32)):
        got = gate_up_silu_triton(x, weight, tile)
        assert got.shape == (rows, 40)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    wide = torch.randn(rows, 300, generator=gen)[:, :100]  # rows 300 apart: a view, not a copy
    torch.testing.assert_close(
        gate_up_silu_triton(wide, weight),
        F.silu(F.linear(wide, weight[:40])) * F.linear(wide, weight[40:]),
        rtol=1e-5,
        atol=1e-4,
    )


def test_the_gate_up_tiles_cover_every_decode_batch() -> None:
    from minisgl.kernel.triton.gate_up_silu import GATE_UP_TILES, MAX_ROWS, gate_up_tile

    assert [most for most, _ in GATE_UP_TILES] == sorted(most for most, _ in GATE_UP_TILES)
    assert GATE_UP_TILES[-1][0] == MAX_ROWS
    assert gate_up_tile(1) is GATE_UP_TILES[0][1] and gate_up_tile(MAX_ROWS) is GATE_UP_TILES[-1][1]
    assert all(t.block_m >= 16 and t.block_n >= 16 and t.block_k >= 16 for _, t in GATE_UP_TILES)


def test_the_mlp_runs_the_gate_up_kernel_only_where_asked(monkeypatch) -> None:
    """The MLP computes the same with the kernel as with the product and SiLU (float32, the
    interpreter standing in for the GPU), and takes the kernel unless turned off (ENV), on a
    GPU in 16 bits, for SiLU, at up to MAX_ROWS rows."""
    from minisgl.kernel.triton.gate_up_silu import MAX_ROWS
    from minisgl.models import utils

    config: Any = SimpleNamespace(hidden_size=64, intermediate_size=48, hidden_act="silu")
    mlp = utils.GatedMLP(config)
    gen = torch.Generator().manual_seed(0)
    mlp.gate_up_proj.weight = torch.randn(96, 64, generator=gen) / 8
    mlp.down_proj.weight = torch.randn(64, 48, generator=gen) / 8
    x = torch.randn(7, 64, generator=gen)
    monkeypatch.setattr(ENV.FUSED_GATE_UP_SILU, "value", True)
    plain = mlp.forward(x)  # a CPU tensor: the product, then SiLU
    assert not mlp._fused_gate_up_silu(x)
    monkeypatch.setattr(utils, "flashinfer_for", lambda x: "kernels")  # as on a GPU
    assert mlp._fused_gate_up_silu(x)
    torch.testing.assert_close(mlp.forward(x), plain, rtol=1e-5, atol=1e-5)
    assert mlp._fused_gate_up_silu(torch.zeros(MAX_ROWS, 64))
    assert not mlp._fused_gate_up_silu(torch.zeros(MAX_ROWS + 1, 64))  # cuBLAS's rows
    monkeypatch.setattr(ENV.FUSED_GATE_UP_SILU, "value", False)  # MINISGL_FUSED_GATE_UP_SILU=0
    assert not mlp._fused_gate_up_silu(x)
    monkeypatch.setattr(ENV.FUSED_GATE_UP_SILU, "value", True)
    gelu = utils.GatedMLP(SimpleNamespace(hidden_size=64, intermediate_size=48, hidden_act="gelu"))
    assert not gelu._fused_gate_up_silu(x)


def test_options_runs_the_engine_without_each_kernel_and_without_all(tmp_path) -> None:
    """`bench_p1.py options`: one run per kernel switched off, one with all off, the official
    engine last; only this engine and the official one get an uncounted run."""
    calls: List[Any] = []

    def ours(name: str, profile: Any = None, env: Any = None) -> Dict:
        calls.append(env)
        return dict(seconds=1.0, tokens=1000, prefill_steps=1, decode_steps=9)

    def official(source: Any, site: Any, profile: Any = None) -> Dict:
        calls.append("official")
        return dict(seconds=1.0, tokens=1000, prefill_steps=1, decode_steps=9)

    out = tmp_path / "options.md"
    with (
        mock.patch("tools.bench_gpu.run_in_child", ours),
        mock.patch("tools.bench_gpu.run_official_in_child", official),
        mock.patch("torch.cuda.get_device_name", lambda: "a GPU"),
    ):
        bench_p1.options(Path("upstream"), None, 1, out)
    switches = [env for _, env in bench_p1.OPTIONS]
    everything = {k: v for env in switches for k, v in env.items()}
    assert calls == [None, "official", None, *switches, everything, "official"]
    table = out.read_text()
    assert "| this engine, without all three |" in table and "Ratios to this engine:" in table
    assert "`MINISGL_TRITON_DECODE=0`" in table


def test_ab_with_files_changes_only_those_files_of_the_after_tree(tmp_path) -> None:
    """`bench_p1.py ab --files`: P1's tree against a copy in which only the named files are
    chapter 22's; every other file stays P1's."""
    seen: Dict[str, Dict[str, str]] = {}

    def build_tree(chapter: str, out: Path) -> Path:
        for name in ("minisgl/engine/graph.py", "minisgl/core.py"):
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(f"{name} of {chapter}")
        return out

    def run_tree(tree: Path) -> Dict:
        files = sorted(tree.rglob("*.py"))
        seen[tree.name] = {str(f.relative_to(tree)): f.read_text() for f in files}
        return dict(seconds=1.0, tokens=1000, prefill_steps=1, decode_steps=9)

    out = tmp_path / "ab.md"
    with (
        mock.patch.object(bench_p1, "build_tree", build_tree),
        mock.patch.object(bench_p1, "run_tree", run_tree),
        mock.patch("torch.cuda.get_device_name", lambda: "a GPU"),
    ):
        bench_p1.ab("22", "P1", 1, out, ["minisgl/engine/graph.py"])
    core, graph = "minisgl/core.py", "minisgl/engine/graph.py"
    assert seen["P1"] == {core: f"{core} of P1", graph: f"{graph} of P1"}
    assert seen["mixed"] == {core: f"{core} of P1", graph: f"{graph} of 22"}
    assert "| project P1, minisgl/engine/graph.py of chapter 22 |" in out.read_text()


def test_the_compiled_kernels_instructions_and_programs_per_sm_are_counted() -> None:
    from tools.compiled_kernel import Compiled, count_instructions, programs_per_sm

    ptx = "\n".join([
        "\tcp.async.cg.shared.global [ %r1 + 0 ], [ %rd2 + 0 ], 0x10, %r3;",
        "\tld.global.v4.b32 { %r4, %r5, %r6, %r7 }, [ %rd8 + 0 ];",
        "\tld.global.b16 { %rs1 }, [ %rd9 + 0 ];",
        "\t@%p1 st.global.v4.b32 [ %rd10 + 0 ], { %r11, %r12, %r13, %r14 };",
        "\tst.global.b32 [ %rd15 + 0 ], { %r16 };  // st.global.b32 in a comment",
        "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...};",
    ])  # fmt: skip
    counts = count_instructions(ptx)
    assert list(counts.values()) == [1, 0, 1, 1, 1, 1, 1]
    # 92 registers: 2,944 a warp, given as 3,072; 4 warps take 12,288 of 65,536
    assert programs_per_sm(Compiled(92, 38916, 4, 1, "")) == dict(
        registers=5, **{"shared memory": 5}, warps=16
    )
    assert programs_per_sm(Compiled(136, 22528, 4, 0, ""))["registers"] == 3


def test_the_decode_kernel_compiled_for_hopper_moves_its_keys_16_bytes_at_a_time(tmp_path) -> None:
    """What the page says of the compiled kernel, with the installed Triton: with the alignment
    that a launch from the engine gives, the keys and values come by 16-byte copies into shared
    memory and the results go out 16 bytes at a time; without it, one number at a time. With
    the page loop the shared memory holds more than one load of keys at once."""
    out = tmp_path / "compiled.md"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real compile
    command = [sys.executable, "tools/bench_p1.py", "compiled", "--out", str(out)]
    subprocess.run(command, cwd=bench_p1.ROOT, env=env, check=True, timeout=600)
    rows: Dict[str, List[int]] = {}
    for line in out.read_text().splitlines()[2:]:
        if not line.startswith("| "):
            break
        name, *cells = [c.strip() for c in line.strip("|").split("|")]
        rows[name] = [int(c.replace(",", "")) for c in cells]
    # columns: the engine's float32 pieces, bfloat16 pieces, the page loop, no alignment marks
    copies = rows["copies to shared memory, 16 bytes (cp.async.cg)"]
    assert copies[0] > 0 and copies[1] > 0 and copies[2] > 0 and copies[3] == 0
    assert all(n > 0 for n in rows["stores, 16 bytes (st.global.v4)"][:3])
    # the marks spare the per-number loads: q and the keys and values, 147 of them without
    single_loads = rows["loads, one number (ld.global)"]
    assert max(single_loads[:3]) <= 4 and single_loads[3] > 64
    buffers = rows["loads of keys held in shared memory"]
    assert buffers[2] >= 2 and buffers[2] > buffers[0]
    assert rows["registers per thread"][0] > 0 and rows["programs per SM, by registers"][0] >= 1


def test_ncus_raw_csv_becomes_a_row_with_the_largest_stalls_first() -> None:
    from tools.kernel_counters import parse_raw_csv, row

    names = [
        "ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "launch__registers_per_thread",
        "launch__shared_mem_per_block_dynamic", "launch__shared_mem_per_block_static",
        "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
        "launch__grid_size", "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__maximum_warps_per_active_cycle_pct",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    ]  # fmt: skip
    units = ["", "", "ns", "byte", "%", "register/thread", "byte", "byte", "block", "block", "",
             "%", "%", "", "", "", ""]  # fmt: skip
    values = ["0", "_decode_piece_kernel(int *, float)", "20,000", "60000000", "71.5", "92",
              "36864", "0", "5", "3", "2048", "38.2", "37.5", "9.25", "0.5", "12",
              "1.25"]  # fmt: skip
    text = "\n".join(
        ["==PROF== Connected to process 1", *(",".join(f'"{c}"' for c in r) for r in
         (names, units, values)), "==PROF== Disconnected from process 1"]
    )  # fmt: skip
    [launch] = parse_raw_csv(text)
    assert launch.kernel == "_decode_piece_kernel"
    # not_selected is a warp that could issue but another did: not a wait, so left out
    assert launch.stalls() == [("long_scoreboard", 9.25), ("wait", 1.25), ("barrier", 0.5)]
    cells = [c.strip() for c in row(129, 245, "page loop", launch).strip("|").split("|")]
    assert cells == [
        "129", "245", "page loop", "_decode_piece_kernel", "2048", "20.0", "3.00", "72", "92",
        "36.0", "3", "38", "38", "long scoreboard 9.2, wait 1.2, barrier 0.5",
    ]  # fmt: skip


def test_counters_profiles_each_kernel_and_step_in_a_process_of_its_own(
    tmp_path, monkeypatch
) -> None:
    """`bench_p1.py counters` with a stand-in for ncu that prints one launch in ncu's raw CSV
    (named after the step it was asked for) and fails for one kernel at one step: a row per
    launch, by step, and the failure named under the table."""
    from tools import kernel_counters

    fake = tmp_path / "ncu"
    fake.write_text(
        "#!/bin/bash\n"
        '[ "$1" = --version ] && { echo "NVIDIA (R) Nsight Compute Command Line Profiler"; '
        'echo "Version 2099.1"; exit 0; }\n'
        'args="$*"; step="${args##*--steps }"\n'
        'case "$args" in *"--label page loop "*) [ "$step" = 577 ] && exit 3;; esac\n'
        'echo "==PROF== Connected"\n'
        'echo \'"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum"\'\n'
        'echo \'"","","ns","byte"\'\n'
        'echo "\\"0\\",\\"kernel_$step(int)\\",\\"1000\\",\\"2000000\\""\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(kernel_counters, "find_ncu", lambda: str(fake))
    out = tmp_path / "counters.md"
    kernel_counters.counters(out, "loop", [577, 129], ["FlashInfer (now)", "page loop"])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 1") or
            line.startswith("| 5")]  # fmt: skip
    cells = [[c.strip() for c in line.strip("|").split("|")][:6] for line in rows]
    assert cells == [
        ["129", "245", "FlashInfer (now)", "kernel_129", "-", "1.0"],
        ["129", "245", "page loop", "kernel_129", "-", "1.0"],
        ["577", "106", "FlashInfer (now)", "kernel_577", "-", "1.0"],
    ]
    assert "2.00 |" in rows[0]  # 2 MB in 1 us
    assert "Not profiled: page loop at step 577: ncu rc 3." in out.read_text()
    assert "Version 2099.1" in out.read_text()


# ------------------------------------- o and down split over their inputs, with the add-and-norm
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_the_split_product_adds_to_the_stream_and_normalises_it(rows: int) -> None:
    """In Triton's interpreter and float32 (exact products): the table's tile and smaller
    ones, on sizes that are no multiple of the tiles (masked edges, a last slice shorter than
    the others) and a strided x; the residual is updated in place."""
    import torch.nn.functional as F

    from minisgl.kernel.triton.product_add_norm import SplitTile, product_add_rmsnorm, split_tile

    gen = torch.Generator().manual_seed(rows)
    wide = torch.randn(rows, 300, generator=gen)
    x, weight = wide[:, :200], torch.randn(72, 200, generator=gen)  # x: rows 300 apart
    norm_weight = 0.5 + torch.rand(72, generator=gen)
    start = torch.randn(rows, 72, generator=gen)
    stream = F.linear(x, weight) + start
    expected = stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_weight
    tiles = (split_tile(200, rows), SplitTile(3, 16, 32, 32), SplitTile(1, 16, 16, 64))
    for tile in tiles:
        residual = start.clone()
        got = product_add_rmsnorm(x, weight, residual, norm_weight, 1e-6, tile)
        torch.testing.assert_close(residual, stream, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 40])
def test_the_split_product_can_make_silu_and_mul_of_its_input(rows: int) -> None:
    """Gated: the product's input is silu(gate) * up of the gate/up output [rows, 2 x 200]
    (interpreter, float32), made as the kernel loads it."""
    import torch.nn.functional as F

    from minisgl.kernel.triton.product_add_norm import SplitTile, product_add_rmsnorm

    gen = torch.Generator().manual_seed(100 + rows)
    gate_up, weight = torch.randn(rows, 400, generator=gen), torch.randn(72, 200, generator=gen)
    norm_weight = 0.5 + torch.rand(72, generator=gen)
    start = torch.randn(rows, 72, generator=gen)
    stream = F.linear(F.silu(gate_up[:, :200]) * gate_up[:, 200:], weight) + start
    expected = stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_weight
    for tile in (None, SplitTile(3, 16, 32, 32)):
        residual = start.clone()
        got = product_add_rmsnorm(gate_up, weight, residual, norm_weight, 1e-6, tile, gated=True)
        torch.testing.assert_close(residual, stream, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError):  # an input of K columns is not gated
        product_add_rmsnorm(gate_up[:, :200], weight, start.clone(), norm_weight, 1e-6, gated=True)


def test_the_split_tiles_cover_every_decode_batch_and_parse_from_the_environment(
    monkeypatch,
) -> None:
    from minisgl.kernel.triton import product_add_norm as split

    for tiles in (*split.SPLIT_TILES.values(), split.DEFAULT_TILES):
        assert [most for most, _ in tiles] == sorted(most for most, _ in tiles)
        assert tiles[-1][0] == split.MAX_ROWS
        assert all(t.block_m >= 16 and t.block_n >= 16 and t.block_k >= 16 for _, t in tiles)
    assert split.split_tile(2048, 1) is split.SPLIT_TILES[2048][0][1]
    assert split.split_tile(1000, split.MAX_ROWS) is split.DEFAULT_TILES[-1][1]
    given = "3072:256=2,64,64,64; 3072:8=8,16,32,128"
    monkeypatch.setattr(ENV.SPLIT_TILES, "value", given)
    assert split.split_tile(3072, 8) == split.SplitTile(8, 16, 32, 128)
    assert split.split_tile(3072, 9) == split.SplitTile(2, 64, 64, 64)
    assert split.split_tile(2048, 1) is split.SPLIT_TILES[2048][0][1]  # K not given: the table


@pytest.mark.parametrize("gate_up_kernel", [True, False])
def test_the_model_splits_o_and_down_only_where_asked(
    model_path, monkeypatch, gate_up_kernel: bool
) -> None:
    """A tiny Qwen3 (float32, the interpreter standing in for the GPU) gives the same logits
    and tokens with o and down split, each ending with the add-and-norm after it, as without;
    the split form runs only when turned on, on a GPU, at up to MAX_ROWS rows. Down makes
    SiLU itself where the gate/up kernel does not run (turned off here, or above its rows)."""
    from minisgl.kernel.triton import product_add_norm
    from minisgl.kernel.triton.product_add_norm import MAX_ROWS
    from minisgl.llm import LLM
    from minisgl.models import utils

    monkeypatch.setattr(ENV.FUSED_GATE_UP_SILU, "value", gate_up_kernel)
    gated: List[bool] = []
    split_product = product_add_norm.product_add_rmsnorm

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        gated.append(kwargs.get("gated", False))
        return split_product(*args, **kwargs)

    monkeypatch.setattr(product_add_norm, "product_add_rmsnorm", spy)

    def run(split: bool) -> Any:
        monkeypatch.setattr(ENV.SPLIT_O_DOWN, "value", split)
        logits: List[torch.Tensor] = []
        with LLM(str(model_path("tiny-qwen3")), dtype=torch.float32, attention_backend="torch",
                 page_size=4, num_page_override=64, max_running_req=4,
                 cuda_graph_max_bs=0) as llm:  # fmt: skip
            sample = llm.engine.sampler.sample
            llm.engine.sampler.sample = lambda x, args: (  # type: ignore[method-assign]
                logits.append(x.clone()) or sample(x, args)
            )
            params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
            outs = llm.generate([[5, 6, 7, 9], [8, 9]], [params, params])
            model = llm.engine.model.model
        return [o["token_ids"] for o in outs], torch.cat(logits), model

    monkeypatch.setattr(utils, "flashinfer_for", lambda x: "kernels")  # as on a GPU
    calls: List[int] = []
    forward_split = utils.DecoderLayer.forward_split
    monkeypatch.setattr(
        utils.DecoderLayer, "forward_split",
        lambda self, *a: calls.append(1) or forward_split(self, *a),
    )  # fmt: skip
    plain_tokens, plain_logits, model = run(split=False)
    assert not calls
    tokens, logits, _ = run(split=True)
    layers = len(model.layers.op_list)
    assert len(calls) == 3 * layers  # one prefill and two decode steps, every layer
    assert gated == [False, not gate_up_kernel] * len(calls)  # o, then down
    assert tokens == plain_tokens and len(tokens[0]) == 3
    torch.testing.assert_close(logits, plain_logits, rtol=1e-4, atol=1e-4)
    hidden = model.embed_tokens.weight.shape[1]
    assert model._split_o_down(torch.zeros(MAX_ROWS, hidden))
    assert not model._split_o_down(torch.zeros(MAX_ROWS + 1, hidden))  # a prefill's rows
    monkeypatch.setattr(utils, "flashinfer_for", lambda x: None)  # a CPU or float32
    assert not model._split_o_down(torch.zeros(1, hidden))
