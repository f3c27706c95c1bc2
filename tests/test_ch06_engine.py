"""Chapter 06: the engine (sizing, forward_batch, several engines in one process) and the
sampler (greedy, temperature, top-k, top-p), the latter tested statistically."""

from __future__ import annotations

import pytest
import torch

from examples.helpers import paging
from minisgl.core import Batch, Req, SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.engine import BatchSamplingArgs, Engine, EngineConfig
from minisgl.engine.sample import Sampler, sample_impl
from tests.support import load_example

ch06 = load_example("examples/ch06_engine.py")


def config_for(path, **kwargs) -> EngineConfig:
    base = dict(
        model_path=str(path),
        tp_info=DistributedInfo(0, 1),
        dtype=torch.float32,
        max_running_req=4,
        page_size=4,
    )
    base.update(kwargs)
    return EngineConfig(**base)


def test_engine_config_properties(model_path) -> None:
    config = config_for(model_path("tiny-qwen3"))
    assert config.model_config.num_layers == 3 and config.max_seq_len == 4096
    assert config_for(model_path("tiny-qwen3"), max_seq_len_override=100).max_forward_len == 100


def test_engine_sizes_its_pool_and_page_table(model_path) -> None:
    engine = Engine(config_for(model_path("tiny-qwen2"), num_page_override=37))
    try:
        assert engine.num_pages == 37
        assert engine.kv_cache.k_cache(0).shape[:2] == (38, 4)  # one extra, dummy page
        assert engine.page_table.shape == (5, 160)  # 4 slots + dummy; 37*4=148 -> 160 columns
        assert engine.max_seq_len == 148
        assert (engine.page_table[4] == 148).all()  # the dummy row points at the dummy page
        assert type(engine.attn_backend).__name__ == "TorchNativeBackend"
    finally:
        engine.shutdown()


def test_engine_sizes_the_pool_from_free_memory(model_path) -> None:
    from minisgl.utils.device import free_memory

    free = free_memory(torch.device("cpu"))
    engine = Engine(config_for(model_path("tiny-qwen3"), memory_ratio=0.002))
    try:
        per_page = 2 * 2 * 128 * 4 * 4 * 3  # K+V x kv heads x head_dim x page x bytes x layers
        assert 1 < engine.num_pages <= 0.002 * free / per_page * 1.05
    finally:
        engine.shutdown()


def test_on_the_cpu_the_default_pool_holds_what_the_request_slots_need(model_path) -> None:
    """A CPU's RAM is shared with everything else: by default the pool takes what 6 requests
    of 512 tokens need (plus a page), not memory_ratio of the free RAM (for this 3-layer model
    that would be tens of millions of tokens)."""
    engine = Engine(
        config_for(model_path("tiny-qwen3"), max_running_req=6, max_seq_len_override=512)
    )
    try:
        assert 6 * 512 <= engine.num_pages * 4 <= 6 * 512 + 8
    finally:
        engine.shutdown()


def test_on_the_cpu_the_default_pool_takes_at_most_a_share_of_the_ram(
    model_path, monkeypatch
) -> None:
    from minisgl.engine import engine as engine_module
    from minisgl.utils.device import total_memory

    monkeypatch.setattr(engine_module, "CPU_MEMORY_SHARE", 0.0005)  # a few MiB, for the test
    engine = Engine(config_for(model_path("tiny-qwen3"), max_running_req=64))
    try:
        per_page = 2 * 2 * 128 * 4 * 4 * 3  # K+V x kv heads x head_dim x page x bytes x layers
        assert 1 < engine.num_pages * per_page <= 0.0005 * total_memory(torch.device("cpu"))
    finally:
        engine.shutdown()


def test_two_engines_one_after_the_other(model_path) -> None:
    prompts = [[5, 6, 7], [100, 200, 300, 400, 500]]
    first = ch06.generate("tiny-qwen3", prompts, 6)
    assert ch06.generate("tiny-qwen3", prompts, 6) == first


def test_forward_batch_advances_requests_and_copies_tokens(model_path) -> None:
    engine = Engine(config_for(model_path("tiny-llama3"), num_page_override=16))
    try:
        allocator = paging.PageAllocator(engine.num_pages, 4, engine.page_table)
        req = Req(
            torch.tensor([3, 4, 5, 6, 7], dtype=torch.int32), 0, 0, 3, 0, SamplingParams(), None
        )  # type: ignore[arg-type]
        batch = paging.prepare_batch([req], "prefill", allocator)
        engine.attn_backend.prepare_metadata(batch)
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        out.copy_done_event.synchronize()
        assert (req.cached_len, req.device_len) == (5, 6)
        assert out.next_tokens_cpu.device.type == "cpu" and out.next_tokens_cpu.dtype == torch.int32
        assert torch.equal(out.next_tokens_cpu, out.next_tokens_gpu.cpu())
    finally:
        engine.shutdown()


def test_dummy_weights_and_bfloat16_run(model_path) -> None:
    engine = Engine(
        config_for(
            model_path("tiny-mistral"),
            num_page_override=16,
            dtype=torch.bfloat16,
            use_dummy_weight=True,
        )
    )
    try:
        assert engine.model.state_dict()["model.embed_tokens.weight"].dtype == torch.bfloat16
        outputs = ch06.run(engine, [[1, 2, 3]], [SamplingParams(max_tokens=4)], eos=[])
        assert len(outputs[0]) == 4
    finally:
        engine.shutdown()


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen2", "tiny-llama3", "tiny-mistral"])
def test_engine_generation_matches_step0(name: str, model_path) -> None:
    step0 = load_example("examples/ch00_step0.py")
    prompts = [[9, 120, 3001], [77, 15, 16, 17, 18, 19, 20, 21, 22, 23], [5]]
    model = step0.Step0Model(model_path(name))
    assert ch06.generate(name, prompts, 10) == [model.generate(p, 10) for p in prompts]


# ------------------------------------------------------------------------------ sampler
def sampler_batch(params) -> Batch:
    reqs = [
        Req(torch.tensor([1], dtype=torch.int32), i, 0, 4, i, p, None) for i, p in enumerate(params)
    ]  # type: ignore[arg-type]
    return Batch(reqs=reqs, phase="decode")


def test_prepare_builds_only_the_tensors_needed() -> None:
    sampler = Sampler(torch.device("cpu"), vocab_size=50)
    assert (
        sampler.prepare(
            sampler_batch([SamplingParams(), SamplingParams(top_k=1, temperature=2)])
        ).temperatures
        is None
    )
    args = sampler.prepare(sampler_batch([SamplingParams(), SamplingParams(temperature=0.5)]))
    assert (
        args.temperatures.tolist() == pytest.approx([1e-6, 0.5])
        and args.top_k is None
        and args.top_p is None
    )
    args = sampler.prepare(
        sampler_batch(
            [SamplingParams(temperature=1, top_k=5), SamplingParams(temperature=1, top_p=0.5)]
        )
    )
    assert args.top_k.tolist() == [5, 50] and args.top_p.tolist() == pytest.approx([1.0, 0.5])


def test_greedy_rows_of_a_mixed_batch_take_the_argmax() -> None:
    torch.manual_seed(0)
    sampler = Sampler(torch.device("cpu"), vocab_size=100)
    logits = torch.randn(2, 100)
    args = sampler.prepare(sampler_batch([SamplingParams(), SamplingParams(temperature=5.0)]))
    draws = torch.stack([sampler.sample(logits, args) for _ in range(200)])
    assert (draws[:, 0] == logits[0].argmax()).all()
    assert len(set(draws[:, 1].tolist())) > 10  # the hot row really samples


def test_top_k_never_picks_outside_the_top_k() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 64).repeat(400, 1)
    top_k = torch.tensor([1, 5, 20]).repeat(400)
    picks = sample_impl(logits, torch.full((1200,), 2.0), top_k, None).view(400, 3)
    for row, k in enumerate([1, 5, 20]):
        allowed = set(logits[row].topk(k).indices.tolist())
        assert set(picks[:, row].tolist()) <= allowed
        assert len(set(picks[:, row].tolist())) == k  # and each of them does occur


def test_top_p_never_picks_outside_the_nucleus() -> None:
    torch.manual_seed(2)
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(3000, 1)
    probs = torch.softmax(logits[0], -1)  # 0.64, 0.24, 0.09, 0.03, ...
    picks = sample_impl(logits, torch.ones(3000), None, torch.full((3000,), 0.8))
    # the smallest set reaching 0.8: tokens 0 and 1 (0.64 + 0.24 = 0.88)
    assert set(picks.tolist()) == {0, 1}
    share = (picks == 0).float().mean().item()
    assert abs(share - probs[0] / (probs[0] + probs[1])) < 0.03


def test_temperature_one_frequencies_match_the_softmax() -> None:
    """Chi-square goodness of fit, at a fixed seed: 40,000 draws over 8 tokens."""
    torch.manual_seed(3)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0]])
    n = 40_000
    picks = sample_impl(logits.repeat(n, 1), torch.ones(n), None, None)
    observed = torch.bincount(picks, minlength=8).double()
    expected = torch.softmax(logits[0].double(), -1) * n
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 24.32  # the 0.999 quantile of chi-square with 7 degrees of freedom
    # and a wrong temperature is caught by the same statistic
    hot = sample_impl(logits.repeat(n, 1), torch.full((n,), 1.5), None, None)
    hot_obs = torch.bincount(hot, minlength=8).double()
    assert float(((hot_obs - expected) ** 2 / expected).sum()) > 100


def test_top_k_then_top_p_combined() -> None:
    torch.manual_seed(4)
    logits = torch.tensor([[3.0, 2.9, 2.8, 0.0, -1.0]]).repeat(2000, 1)
    picks = sample_impl(logits, torch.ones(2000), torch.full((2000,), 3), torch.full((2000,), 0.5))
    # top-3 renormalised: ~0.37, 0.33, 0.30; the nucleus of 0.5 keeps the first two
    assert set(picks.tolist()) == {0, 1}


def test_args_dataclass_defaults() -> None:
    args = BatchSamplingArgs(temperatures=None)
    assert args.top_k is None and args.top_p is None
