"""Chapter 07: the scheduler's loop, continuous batching, and the token pool."""

from __future__ import annotations

from typing import List

import pytest
import torch

from examples.helpers import scripted
from minisgl.core import Batch, Req, SamplingParams
from minisgl.message import AbortBackendMsg
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.scheduler import _make_input_tuple, _make_positions, _make_write_tuple
from minisgl.scheduler.table import TableManager
from tests.support import load_example, requires_model, step0_reference
from tools.parity import build_prompts


def reference(model_path, name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    return step0_reference(model_path(name), prompts, n)


PROMPTS = [[9, 120, 3001], [77, 15, 16, 17, 18, 19, 20, 21, 22, 23], [5], [400, 401, 402, 403]]


def run(arrivals, **config) -> "scripted.ScriptedScheduler":
    # no prefix cache (from chapter 09 the default keeps finished prompts' pages)
    config.setdefault("cache_type", "naive")
    sched = scripted.ScriptedScheduler(
        scripted.make_config("tiny-qwen3", **config), arrivals, trace=False
    )
    sched.run()
    return sched


def test_staggered_arrivals_give_each_request_its_own_tokens(model_path) -> None:
    arrivals = [
        (step, scripted.user_msg(i, p, 9)) for i, (step, p) in enumerate(zip([0, 2, 3, 7], PROMPTS))
    ]
    sched = run(arrivals)
    try:
        assert [sched.outputs[i] for i in range(4)] == reference(
            model_path, "tiny-qwen3", PROMPTS, 9
        )
        # every page and every request slot is back
        assert len(sched.cache_manager.free_slots) == sched.cache_manager.num_pages
        assert sched.table_manager.available_size == 16
    finally:
        sched.shutdown()


def test_prefill_first_and_batch_composition() -> None:
    """A request arriving during decode is prefilled at the next step; the decode batch then
    holds every running request, and finished ones leave."""
    phases: List[tuple] = []

    class Recorder(scripted.ScriptedScheduler):
        def _forward(self, forward_input):
            batch = forward_input.batch
            phases.append((self.step, batch.phase, [r.uid for r in batch.reqs]))
            return super()._forward(forward_input)

    arrivals = [
        (0, scripted.user_msg(0, PROMPTS[0], 4)),
        (0, scripted.user_msg(1, PROMPTS[1], 2)),
        (2, scripted.user_msg(2, PROMPTS[2], 3)),
    ]
    sched = Recorder(scripted.make_config("tiny-qwen3"), arrivals)
    sched.run()
    sched.shutdown()
    assert phases == [
        (0, "prefill", [0, 1]),  # both arrive together: one prefill batch
        (1, "decode", [0, 1]),  # r1 makes its second (last) token
        (2, "prefill", [2]),  # r2 arrives: prefill comes first
        (3, "decode", [0, 2]),
        (4, "decode", [0, 2]),  # r0's fourth token and r2's third: both done
    ]
    assert [len(sched.outputs[i]) for i in range(3)] == [4, 2, 3]


def test_the_token_pool_holds_prompt_and_outputs() -> None:
    sched = scripted.ScriptedScheduler(
        scripted.make_config("tiny-llama3"), [(0, scripted.user_msg(0, PROMPTS[1], 5))]
    )
    seen = {}
    original = sched._free_req_resources

    def capture(req: Req) -> None:
        # the request's row, read just before its slot is given back
        seen["row"] = sched.token_pool[req.table_idx, : req.device_len].tolist()
        seen["ids"] = req.input_ids.tolist()
        original(req)

    sched._free_req_resources = capture  # type: ignore[method-assign]
    sched.run()
    sched.shutdown()
    assert seen["row"] == seen["ids"] == PROMPTS[1] + sched.outputs[0]


def test_max_tokens_and_eos() -> None:
    # the tiny models' greedy outputs rarely hit EOS (id 2); with ignore_eos=False and a small
    # max_tokens the request stops at max_tokens exactly
    sched = run(
        [
            (0, scripted.user_msg(0, PROMPTS[0], 1)),
            (0, scripted.user_msg(1, PROMPTS[2], 7, ignore_eos=True)),
        ]
    )
    sched.shutdown()
    assert len(sched.outputs[0]) == 1 and len(sched.outputs[1]) == 7


@requires_model("smollm2-135m")
def test_stopping_at_eos(model_path) -> None:
    """SmolLM2 ends its answer with <|im_end|> (the EOS): the scheduler stops there."""
    prompt = build_prompts("smollm2-135m", ["Hi"])[0]  # a chat: "Hello! How can I ..." + EOS
    sched = scripted.ScriptedScheduler(
        scripted.make_config("smollm2-135m"), [(0, scripted.user_msg(0, prompt, 40))]
    )
    sched.run()
    sched.shutdown()
    out = sched.outputs[0]
    assert out[-1] == sched.eos_token_id and sched.eos_token_id not in out[:-1] and len(out) < 40


def test_abort_of_a_waiting_and_a_running_request() -> None:
    arrivals = [
        (0, scripted.user_msg(0, PROMPTS[0], 30)),
        (0, scripted.user_msg(1, PROMPTS[1], 30)),
        (3, AbortBackendMsg(uid=0)),
        (3, scripted.user_msg(2, PROMPTS[2], 3)),
        (3, AbortBackendMsg(uid=2)),
    ]
    sched = run(arrivals)
    sched.shutdown()
    assert 1 <= len(sched.outputs[0]) <= 3  # aborted while running: it stopped early
    assert 2 not in sched.outputs  # aborted while waiting: never ran
    assert len(sched.outputs[1]) == 30
    assert len(sched.cache_manager.free_slots) == sched.cache_manager.num_pages
    assert sched.table_manager.available_size == 16


def test_batch_index_helpers() -> None:
    sp = SamplingParams(max_tokens=4)
    a = Req(torch.arange(5, dtype=torch.int32), 3, 0, 4, 0, sp, None)  # type: ignore[arg-type]
    b = Req(torch.arange(9, dtype=torch.int32), 1, 8, 1, 1, sp, None)  # type: ignore[arg-type]
    b.complete_one()  # b now computes position 9, and that is its last token (remain_len 0)
    batch = Batch(reqs=[a, b], phase="prefill")
    batch.padded_reqs = batch.reqs
    cpu = torch.device("cpu")
    batch.positions = _make_positions(batch, cpu)
    assert batch.positions.tolist() == [0, 1, 2, 3, 4, 9]
    slots, positions = _make_input_tuple(batch, cpu)
    assert slots.tolist() == [3, 3, 3, 3, 3, 1] and positions.tolist() == [0, 1, 2, 3, 4, 9]
    slots, positions = _make_write_tuple(batch, cpu)
    # a's sample goes to position 5; b has no output left to write (remain_len == 0)
    assert slots.tolist() == [3, 1] and positions.tolist() == [5, -1]


def test_decode_manager_keeps_order_and_drops_finished() -> None:
    sp = SamplingParams(max_tokens=2)
    reqs = [Req(torch.arange(3, dtype=torch.int32), i, 0, 2, i, sp, None) for i in range(3)]  # type: ignore[arg-type]
    manager = DecodeManager(page_size=4)
    manager.filter_reqs(reqs)
    assert list(manager.running_reqs) == reqs and manager.inflight_tokens == 3 * 2 + 3 * 3
    reqs[1].complete_one()
    reqs[1].complete_one()  # out of budget
    manager.filter_reqs([])
    assert list(manager.running_reqs) == [reqs[0], reqs[2]]
    assert manager.abort_req(2) is reqs[2] and manager.abort_req(2) is None
    batch = manager.schedule_next_batch()
    assert batch is not None and batch.is_decode and batch.reqs == [reqs[0]]


def test_table_manager() -> None:
    table = TableManager(3, torch.zeros(4, 8, dtype=torch.int32))
    slots = [table.allocate() for _ in range(3)]
    assert sorted(slots) == [0, 1, 2] and table.available_size == 0
    table.free(slots[0])
    assert table.available_size == 1 and table.allocate() == slots[0]
    assert table.token_pool.shape == (4, 8) and table.token_pool.dtype == torch.int32


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-mistral"])
def test_parity_through_the_scheduler(name: str, model_path) -> None:
    ch07 = load_example("examples/ch07_scheduler.py")
    assert ch07.generate(name, PROMPTS, 12) == reference(model_path, name, PROMPTS, 12)
