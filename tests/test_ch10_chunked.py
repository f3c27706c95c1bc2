"""Chapter 10: chunked prefill under a token budget."""

from __future__ import annotations

from typing import List, Tuple

import pytest
import torch

from examples.helpers import scripted
from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
from minisgl.scheduler.table import TableManager
from minisgl.scheduler.utils import PendingReq
from tests.support import step0_reference


def reference(model_path, name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    return step0_reference(model_path(name), prompts, n)


class Recorder(scripted.ScriptedScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: List[Tuple[str, List[Tuple[int, int, bool]]]] = []

    def _forward(self, forward_input):
        batch = forward_input.batch
        self.batches.append(
            (batch.phase, [(r.uid, r.extend_len, isinstance(r, ChunkedReq)) for r in batch.reqs])
        )
        return super()._forward(forward_input)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama3"])
@pytest.mark.parametrize("budget, page_size", [(4, 1), (7, 4), (16, 16)])
def test_prompts_many_times_the_budget_match(
    name: str, budget: int, page_size: int, model_path
) -> None:
    g = torch.Generator().manual_seed(budget)
    prompts = [torch.randint(3, 40000, (n,), generator=g).tolist() for n in (61, 5, 33)]
    arrivals = [
        (0, scripted.user_msg(0, prompts[0], 8)),
        (1, scripted.user_msg(1, prompts[1], 8)),
        (2, scripted.user_msg(2, prompts[2], 8)),
    ]
    sched = Recorder(
        scripted.make_config(name, max_extend_tokens=budget, page_size=page_size), arrivals
    )
    outputs = sched.run()
    sched.cache_manager.check_integrity()
    sched.shutdown()
    assert [outputs[i] for i in range(3)] == reference(model_path, name, prompts, 8)
    for phase, reqs in sched.batches:
        if phase == "prefill":
            assert sum(n for _, n, _ in reqs) <= budget  # never beyond the budget
    chunks_of_r0 = [
        n for phase, reqs in sched.batches for uid, n, _ in reqs if uid == 0 and phase == "prefill"
    ]
    assert sum(chunks_of_r0) == 61 and len(chunks_of_r0) >= 61 // budget


def test_decoding_requests_take_turns_with_the_chunks() -> None:
    arrivals = [
        (0, scripted.user_msg(0, [5, 6, 7], 20)),
        (1, scripted.user_msg(1, list(range(100, 140)), 3)),
    ]
    sched = Recorder(scripted.make_config("tiny-qwen2", max_extend_tokens=10), arrivals)
    sched.run()
    sched.shutdown()
    chunk_steps = [
        i for i, (phase, reqs) in enumerate(sched.batches) if phase == "prefill" and reqs[0][0] == 1
    ]
    assert [sched.batches[i][1][0][1] for i in chunk_steps] == [10, 10, 10, 10]  # 40 tokens
    for a, b in zip(chunk_steps, chunk_steps[1:]):  # between two chunks, r0 decodes
        between = sched.batches[a + 1 : b]
        assert any(
            phase == "decode" and 0 in [uid for uid, _, _ in reqs] for phase, reqs in between
        )
    flags = [sched.batches[i][1][0][2] for i in chunk_steps]
    assert flags == [True, True, True, False]  # the last piece is an ordinary Req


def test_chunks_after_a_cached_prefix() -> None:
    """The second request reuses 40 cached tokens and prefills the remaining 30 in chunks."""
    common = list(range(1000, 1040))
    arrivals = [
        (0, scripted.user_msg(0, common + [1, 2], 4)),
        (6, scripted.user_msg(1, common + list(range(2000, 2030)), 4)),
    ]
    sched = Recorder(
        scripted.make_config("tiny-mistral", max_extend_tokens=12, cache_type="radix"), arrivals
    )
    sched.run()
    sched.cache_manager.check_integrity()
    sched.shutdown()
    chunks = [
        n for phase, reqs in sched.batches for uid, n, _ in reqs if uid == 1 and phase == "prefill"
    ]
    assert chunks == [12, 12, 6]


def test_aborting_a_request_between_chunks_frees_everything() -> None:
    arrivals = [
        (0, scripted.user_msg(0, list(range(100, 160)), 4)),
        (2, AbortBackendMsg(uid=0)),
        (3, scripted.user_msg(1, [7, 8, 9], 4)),
    ]
    sched = Recorder(scripted.make_config("tiny-qwen3", max_extend_tokens=8), arrivals)
    outputs = sched.run()
    sched.cache_manager.check_integrity()
    assert 0 not in outputs and len(outputs[1]) == 4
    assert sched.table_manager.available_size == 16
    sched.shutdown()


def test_the_adder_cuts_at_the_budget() -> None:
    table = torch.zeros(5, 64, dtype=torch.int32)
    cache = CacheManager(64, 1, table, "naive")
    adder = PrefillAdder(10, 0, cache, TableManager(4, table))
    first = adder.try_add_one(
        PendingReq(0, torch.arange(4, dtype=torch.int32), SamplingParams(max_tokens=2))
    )
    second = adder.try_add_one(
        PendingReq(1, torch.arange(9, dtype=torch.int32), SamplingParams(max_tokens=2))
    )
    assert first is not None and not isinstance(first, ChunkedReq) and first.extend_len == 4
    assert isinstance(second, ChunkedReq) and second.extend_len == 6 and not second.can_decode
    assert (
        adder.try_add_one(PendingReq(2, torch.arange(2, dtype=torch.int32), SamplingParams()))
        is None
    )
    with pytest.raises(NotImplementedError):
        second.append_host(torch.tensor([1], dtype=torch.int32))
