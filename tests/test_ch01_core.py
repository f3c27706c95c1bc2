"""Chapter 01: core data structures, the device abstraction and the small utilities."""

from __future__ import annotations

import logging
from argparse import ArgumentTypeError

import pytest
import torch

from minisgl.core import (
    Batch,
    Context,
    Req,
    SamplingParams,
    clear_global_ctx,
    get_global_ctx,
    set_global_ctx,
)
from minisgl.distributed import DistributedInfo, reset_tp_info, set_tp_info, try_get_tp_info
from minisgl.utils import (
    UNSET,
    Registry,
    align_ceil,
    align_down,
    call_if_main,
    div_ceil,
    div_even,
    init_logger,
    torch_dtype,
)
from minisgl.utils import device as dev


def make_req(prompt_len: int = 5, output_len: int = 3, cached_len: int = 0) -> Req:
    return Req(
        input_ids=torch.arange(prompt_len, dtype=torch.int32),
        table_idx=0,
        cached_len=cached_len,
        output_len=output_len,
        uid=7,
        sampling_params=SamplingParams(max_tokens=output_len),
        cache_handle=None,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    "params, greedy",
    [
        (SamplingParams(), True),
        (SamplingParams(temperature=0.7), False),
        (SamplingParams(temperature=0.7, top_k=1), True),
        (SamplingParams(temperature=0.0, top_p=0.9), False),
        (SamplingParams(temperature=1.0, top_k=50, top_p=0.9), False),
    ],
)
def test_sampling_params_greedy(params: SamplingParams, greedy: bool) -> None:
    assert params.is_greedy is greedy


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("max_tokens", -1, "max_tokens must be an integer >= 0"),
        ("max_tokens", 2.5, "max_tokens must be an integer >= 0"),
        ("temperature", float("nan"), "temperature must be a finite number >= 0"),
        ("temperature", float("inf"), "temperature must be a finite number >= 0"),
        ("temperature", -1.0, "temperature must be a finite number >= 0"),
        ("top_p", 0.0, r"top_p must be in \(0, 1\]"),
        ("top_p", -0.5, r"top_p must be in \(0, 1\]"),
        ("top_p", 1.5, r"top_p must be in \(0, 1\]"),
        ("top_k", 0, "top_k must be -1 .no filter. or an integer >= 1"),
        ("top_k", -5, "top_k must be -1 .no filter. or an integer >= 1"),
        ("ignore_eos", "yes", "ignore_eos must be true or false"),
    ],
)
def test_sampling_params_out_of_range_are_refused_naming_the_field(
    field: str, value: object, allowed: str
) -> None:
    with pytest.raises(ValueError, match=allowed):
        SamplingParams(**{field: value})


def test_sampling_params_at_the_edges_of_their_ranges_are_accepted() -> None:
    for params in (
        SamplingParams(max_tokens=0),  # no new token
        SamplingParams(temperature=0, top_k=-1, top_p=1),
        SamplingParams(temperature=2.0, top_k=1, top_p=1e-6),
    ):
        assert params.max_tokens >= 0


def test_req_lengths_walk_through_prefill_and_decode() -> None:
    req = make_req(prompt_len=5, output_len=3)
    assert (req.cached_len, req.device_len, req.max_device_len) == (0, 5, 8)
    assert (req.extend_len, req.remain_len, req.can_decode) == (5, 3, True)
    # the prefill computes tokens 0..4 and samples token 5
    req.complete_one()
    req.append_host(torch.tensor([11], dtype=torch.int32))
    assert (req.cached_len, req.device_len, req.extend_len, req.remain_len) == (5, 6, 1, 2)
    assert req.input_ids.tolist() == [0, 1, 2, 3, 4, 11]
    # two decode steps use up the budget
    for token in (12, 13):
        req.complete_one()
        req.append_host(torch.tensor([token], dtype=torch.int32))
    assert (req.cached_len, req.device_len, req.remain_len, req.can_decode) == (7, 8, 0, False)
    assert len(req.input_ids) == req.device_len


def test_req_with_a_cached_prefix_extends_only_the_rest() -> None:
    req = make_req(prompt_len=10, output_len=4, cached_len=6)
    assert req.extend_len == 4


@pytest.mark.parametrize("cached_len", [-1, 5, 9])
def test_req_rejects_impossible_lengths(cached_len: int) -> None:
    with pytest.raises(AssertionError):
        make_req(prompt_len=5, output_len=3, cached_len=cached_len)


def test_req_tokens_must_live_on_the_cpu() -> None:
    with pytest.raises(AssertionError):
        Req(torch.zeros(3, dtype=torch.int32, device="meta"), 0, 0, 1, 0, SamplingParams(), None)  # type: ignore[arg-type]


def test_batch_phase_and_sizes() -> None:
    reqs = [make_req(), make_req()]
    batch = Batch(reqs=reqs, phase="decode")
    assert batch.is_decode and not batch.is_prefill and batch.size == 2
    batch.padded_reqs = reqs + [reqs[0]]
    assert batch.padded_size == 3
    with pytest.raises(AttributeError):
        _ = Batch(reqs=reqs, phase="prefill").input_ids  # set later, by the scheduler


def test_context_holds_exactly_one_batch_at_a_time() -> None:
    ctx = Context(page_size=4)
    batch = Batch(reqs=[make_req()], phase="prefill")
    with pytest.raises(AssertionError, match="no batch"):
        _ = ctx.batch
    with ctx.forward_batch(batch):
        assert ctx.batch is batch
        with pytest.raises(AssertionError, match="does not nest"):
            with ctx.forward_batch(batch):
                pass
    with pytest.raises(AssertionError):
        _ = ctx.batch
    # an exception inside the block still clears the batch
    with pytest.raises(RuntimeError):
        with ctx.forward_batch(batch):
            raise RuntimeError("boom")
    assert ctx._batch is None


def test_global_context_is_set_once() -> None:
    clear_global_ctx()
    with pytest.raises(AssertionError):
        get_global_ctx()
    ctx = Context(page_size=1)
    set_global_ctx(ctx)
    try:
        assert get_global_ctx() is ctx
        with pytest.raises(AssertionError):
            set_global_ctx(Context(page_size=1))
    finally:
        clear_global_ctx()


def test_registry() -> None:
    reg: Registry[int] = Registry("Thing")
    reg.register("one")(1)
    assert reg["one"] == 1 and reg.supported_names() == ["one"]
    with pytest.raises(KeyError, match="already registered"):
        reg.register("one")
    with pytest.raises(KeyError, match="unsupported Thing: 'two'"):
        reg["two"]
    reg.assert_supported(["one"])
    with pytest.raises(ArgumentTypeError, match="supported: \\['one'\\]"):
        reg.assert_supported("two")


def test_integer_helpers() -> None:
    assert div_even(12, 4) == 3
    with pytest.raises(AssertionError):
        div_even(10, 4)
    assert div_even(2, 8, allow_replicate=True) == 1  # 8 ranks, 2 KV heads: replicate
    with pytest.raises(AssertionError):
        div_even(3, 8, allow_replicate=True)
    assert (div_ceil(10, 4), align_ceil(10, 4), align_down(10, 4)) == (3, 12, 8)
    assert repr(UNSET) == "UNSET"


def test_call_if_main() -> None:
    calls = []

    @call_if_main("some.module")
    def kept() -> None:
        calls.append("kept")

    assert kept is not None and calls == []  # imported: not run, kept

    @call_if_main("__main__")
    def ran() -> None:
        calls.append("ran")

    assert ran is None and calls == ["ran"]  # a script: run, then dropped


def test_torch_dtype_context() -> None:
    with torch_dtype(torch.float64):
        assert torch.empty(1).dtype == torch.float64
    assert torch.empty(1).dtype == torch.float32


def test_device_abstraction_is_a_no_op_on_the_cpu() -> None:
    cpu = torch.device("cpu")
    stream, other = dev.Stream(cpu), dev.current_stream(cpu)
    stream.wait_stream(other)
    dev.set_stream(stream)
    with dev.use_stream(stream):
        x = torch.ones(3)
    event = dev.Event(cpu)
    event.record(stream)
    assert event.query()
    event.synchronize()
    stream.synchronize()
    dev.synchronize(cpu)
    host = dev.host_tensor([1, 2, 3], torch.int32, cpu)
    assert not host.is_pinned() and not dev.pin_memory(cpu)
    assert dev.to_device(host, cpu) is host
    assert dev.free_memory(cpu) > 0
    assert x.sum() == 3


def test_default_device_can_be_forced_to_cpu(monkeypatch) -> None:
    monkeypatch.setenv("MINISGL_DEVICE", "cpu")
    assert dev.default_device() == torch.device("cpu")


def test_logger_rank0_methods(capsys) -> None:
    reset_tp_info()
    logger = init_logger("book.test.logger", level="INFO")
    logger.info_rank0("before tp")
    set_tp_info(1, 2)
    try:
        logger.info_rank0("hidden on rank 1")
        logger.info("shown on every rank")
    finally:
        reset_tp_info()
    out = capsys.readouterr().out
    assert "before tp" in out and "shown on every rank|" not in out
    assert "hidden on rank 1" not in out and "|rank=1] INFO" in out
    assert logger.level == logging.INFO


def test_distributed_info() -> None:
    assert DistributedInfo(0, 2).is_primary() and not DistributedInfo(1, 2).is_primary()
    with pytest.raises(AssertionError):
        DistributedInfo(2, 2)
    assert try_get_tp_info() is None


def test_req_driven_generation_matches_step0(model_path) -> None:
    """The Req-driven loop of this chapter's main gives step 0's tokens."""
    from tests.support import load_example

    ch01, step0 = load_example("examples/ch01_core.py"), load_example("examples/ch00_step0.py")
    folder = model_path("tiny-qwen3")
    clear_global_ctx()
    set_global_ctx(Context(page_size=1))
    try:
        prompt = [5, 17, 230, 4000]
        ours = ch01.generate("tiny-qwen3", [prompt], 10)[0]
    finally:
        clear_global_ctx()
    assert ours == step0.Step0Model(folder).generate(prompt, 10)
