"""Project P1: the host work of a step and the sampler, made cheaper without changing what
they compute; and the arithmetic of the workload's physical limit."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List
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


def test_the_workload_limit_covers_upstreams_requests() -> None:
    from minisgl.benchmark.offline import make_offline_workload

    work = make_offline_workload()
    result = bench_p1.workload_limit()
    assert result.output_tokens == sum(p.max_tokens for p in work.sampling_params)
    assert result.decode_steps == max(p.max_tokens for p in work.sampling_params) - 1
    assert 0 < result.prefill_s < result.decode_s
