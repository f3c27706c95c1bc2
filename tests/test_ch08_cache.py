"""Chapter 08: page allocation and release for every page size, admission control, the naive
prefix cache, the integrity check, and requests that can never fit."""

from __future__ import annotations

from typing import List

import pytest
import torch

from examples.helpers import scripted
from minisgl.core import Req, SamplingParams
from minisgl.kvcache import create_prefix_cache
from minisgl.kvcache.naive_cache import NaiveCacheHandle
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import PrefillAdder
from minisgl.scheduler.table import TableManager
from minisgl.scheduler.utils import PendingReq
from tests.support import step0_reference

PROMPTS = [[9, 120, 3001], [77, 15, 16, 17, 18, 19, 20, 21, 22, 23], [5], [400, 401, 402, 403, 404]]


def reference(model_path, name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    return step0_reference(model_path(name), prompts, n)


def run(name: str, arrivals, **config):
    sched = scripted.ScriptedScheduler(
        scripted.make_config(name, cache_type="naive", **config), arrivals
    )
    try:
        outputs = sched.run()
        sched.cache_manager.check_integrity()
        assert len(sched.cache_manager.free_slots) == sched.cache_manager.num_pages
    finally:
        sched.shutdown()
    return sched, outputs


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_every_page_size_gives_the_same_tokens_and_returns_every_page(
    page_size: int, model_path
) -> None:
    arrivals = [
        (step, scripted.user_msg(i, p, 10))
        for i, (step, p) in enumerate(zip([0, 0, 4, 5], PROMPTS))
    ]
    _, outputs = run(
        "tiny-qwen3", arrivals, page_size=page_size, num_page_override=256 // page_size
    )
    assert [outputs[i] for i in range(4)] == reference(model_path, "tiny-qwen3", PROMPTS, 10)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_memory_pressure_queues_requests_instead_of_failing(page_size: int, model_path) -> None:
    """A pool that holds one request at a time: the others wait, then run, and all finish."""
    biggest = max(len(p) for p in PROMPTS) + 10
    pages = -(-biggest // page_size) + 1  # room for the biggest request and a spare page
    running: List[int] = []

    class Watcher(scripted.ScriptedScheduler):
        def _forward(self, forward_input):
            running.append(len(self.decode_manager.running_reqs) + forward_input.batch.is_prefill)
            return super()._forward(forward_input)

    sched = Watcher(
        scripted.make_config(
            "tiny-llama3", cache_type="naive", page_size=page_size, num_page_override=pages
        ),
        [(0, scripted.user_msg(i, p, 10)) for i, p in enumerate(PROMPTS)],
    )
    outputs = sched.run()
    sched.cache_manager.check_integrity()
    sched.shutdown()
    assert [outputs[i] for i in range(4)] == reference(model_path, "tiny-llama3", PROMPTS, 10)
    assert max(running) < 4  # never all four at once: some had to wait


def make_adder(free_pages: int, page_size: int, reserved: int, budget: int = 1000):
    table = torch.zeros(5, 64, dtype=torch.int32)
    cache = CacheManager(free_pages, page_size, table, "naive")
    return PrefillAdder(budget, reserved, cache, TableManager(4, table))


def pending(uid: int, prompt_len: int, max_tokens: int) -> PendingReq:
    return PendingReq(
        uid, torch.arange(prompt_len, dtype=torch.int32), SamplingParams(max_tokens=max_tokens)
    )


def test_admission_counts_prompt_output_and_what_running_requests_still_need() -> None:
    # 10 pages of 4 = 40 slots; running requests may still need 20 of them
    adder = make_adder(free_pages=10, page_size=4, reserved=20)
    assert adder.try_add_one(pending(0, 12, 8)) is not None  # 12 + 8 + 20 = 40: fits exactly
    assert adder.reserved_size == 40
    assert adder.try_add_one(pending(1, 1, 1)) is None  # nothing left
    adder = make_adder(free_pages=10, page_size=4, reserved=21)
    assert adder.try_add_one(pending(0, 12, 8)) is None  # one slot short: it waits
    assert adder.table_manager.available_size == 4  # and took no request slot


def test_admission_stops_at_the_token_budget_and_the_slots() -> None:
    adder = make_adder(free_pages=100, page_size=1, reserved=0, budget=10)
    assert adder.try_add_one(pending(0, 6, 1)) is not None
    assert adder.try_add_one(pending(1, 6, 1)) is not None  # 4 left of the budget: still admitted
    # (whole here; from chapter 10 only its first 4 tokens, the rest in a later batch)
    assert adder.token_budget <= 0 and adder.try_add_one(pending(2, 1, 1)) is None
    adder = make_adder(free_pages=100, page_size=1, reserved=0)
    assert all(adder.try_add_one(pending(i, 2, 2)) for i in range(4))
    assert adder.try_add_one(pending(4, 2, 2)) is None  # four request slots only


def test_allocate_and_release_pages_through_the_page_table() -> None:
    table = torch.full((3, 32), -1, dtype=torch.int32)
    cache = CacheManager(8, 4, table, "naive")
    req = Req(torch.arange(6, dtype=torch.int32), 1, 0, 5, 0, SamplingParams(), NaiveCacheHandle())
    cache.allocate_paged([req])  # positions 0..5: two pages
    row = table[1, :8].tolist()
    assert len(cache.free_slots) == 6 and row[0] % 4 == 0 and row[4] % 4 == 0
    assert row[:4] == list(range(row[0], row[0] + 4)) and row[4:8] == list(
        range(row[4], row[4] + 4)
    )
    for _ in range(3):  # positions 6, 7, 8: a third page only at 8
        req.complete_one()
        cache.allocate_paged([req])
    assert len(cache.free_slots) == 5
    req.complete_one()  # the forward pass that wrote position 8 is done
    cache.cache_req(req, finished=True)
    assert len(cache.free_slots) == 8
    cache.check_integrity()


def test_integrity_check_catches_leaks_and_double_frees() -> None:
    cache = CacheManager(8, 2, torch.zeros(2, 16, dtype=torch.int32), "naive")
    cache.check_integrity()
    taken = cache._allocate(2)
    with pytest.raises(
        RuntimeError, match="free pages \\(6\\) \\+ cached pages \\(0\\) != all pages \\(8\\)"
    ):
        cache.check_integrity()  # a leak
    cache._free(cache._page_to_token(taken))
    cache.check_integrity()
    cache._free(cache._page_to_token(taken[:1]))  # the same page again
    with pytest.raises(RuntimeError):
        cache.check_integrity()


def test_lazy_free_region_returns_pages_at_the_end() -> None:
    cache = CacheManager(4, 1, torch.zeros(2, 8, dtype=torch.int32), "naive")
    taken = cache._allocate(3)
    with cache.lazy_free_region():
        cache._free(taken[:2])
        cache._free(taken[2:])
        assert len(cache.free_slots) == 1  # nothing returned yet
    assert len(cache.free_slots) == 4
    cache.check_integrity()


def test_the_naive_cache_caches_nothing() -> None:
    cache = create_prefix_cache(torch.device("cpu"), "naive")
    handle = cache.match_prefix(torch.arange(10)).cuda_handle
    assert handle.cached_len == 0 and len(handle.get_matched_indices()) == 0
    assert cache.insert_prefix(torch.arange(10), torch.arange(10)).cached_len == 0
    assert len(cache.evict(0)) == 0 and cache.size_info.total_size == 0
    with pytest.raises(RuntimeError, match="nothing to evict"):
        cache.evict(1)
    with pytest.raises(KeyError, match="unsupported Cache Manager"):
        create_prefix_cache(torch.device("cpu"), "lru")


def test_a_prompt_longer_than_the_engine_is_refused_with_the_reason() -> None:
    """The pool holds 64 tokens: a 70-token prompt is refused at once, with the reason; a
    request asking for more output than fits is capped; the others are served."""
    replies = []

    class Recorder(scripted.ScriptedScheduler):
        def offline_send_result(self, reply):
            replies.extend(reply)
            super().offline_send_result(reply)

    shared = SamplingParams(max_tokens=100)
    arrivals = [
        (0, scripted.user_msg(0, list(range(3, 73)), 5)),
        (0, scripted.UserMsg(1, torch.arange(3, 13, dtype=torch.int32), shared)),
        (0, scripted.user_msg(2, [5, 6, 7], 4)),
    ]
    sched = Recorder(
        scripted.make_config("tiny-qwen2", cache_type="naive", page_size=4, num_page_override=16),
        arrivals,
    )
    sched.run()
    sched.cache_manager.check_integrity()
    sched.shutdown()
    refused = [r for r in replies if r.uid == 0]
    assert len(refused) == 1 and refused[0].finished and refused[0].next_token == -1
    assert "70 tokens" in refused[0].error and "64" in refused[0].error
    assert len(sched.outputs[1]) == 64 - 10  # capped to what fits
    assert shared.max_tokens == 100  # the caller's object is untouched
    assert len(sched.outputs[2]) == 4


def test_idle_scheduler_checks_integrity() -> None:
    sched = scripted.ScriptedScheduler(
        scripted.make_config("tiny-qwen3", cache_type="naive"),
        [(0, scripted.user_msg(0, [4, 5], 2)), (9, scripted.user_msg(1, [6], 2))],
    )
    leaked = []
    original = sched.cache_manager.cache_req

    def leaky(req, *, finished):  # forgets to free the first request's pages
        if finished and not leaked:
            leaked.append(req.uid)
            return
        original(req, finished=finished)

    sched.cache_manager.cache_req = leaky  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="integrity check failed"):
            sched.run()  # idle between the two arrivals: the check runs and finds the leak
    finally:
        sched.shutdown()


def test_a_token_outside_the_vocabulary_is_refused_and_max_tokens_0_generates_nothing() -> None:
    """Requests the engine cannot serve are refused at arrival with the reason, holding
    nothing: the integrity check passes, every slot is free, and the valid requests around
    them get their tokens. max_tokens=0 finishes at once with no token."""
    replies = []

    class Recorder(scripted.ScriptedScheduler):
        def offline_send_result(self, reply):
            replies.extend(reply)
            super().offline_send_result(reply)

    vocab = 49152
    arrivals = [
        (0, scripted.user_msg(0, [5, vocab, 7], 4)),  # one past the last id
        (0, scripted.user_msg(1, [5, 6, 7], 4)),
        (1, scripted.user_msg(2, [-1, 6], 4)),
        (1, scripted.user_msg(3, [8, 9], 0)),
        (2, scripted.user_msg(4, [5, 6, 7], 4)),
    ]
    sched = Recorder(
        scripted.make_config("tiny-qwen2", cache_type="naive", page_size=4, num_page_override=16),
        arrivals,
    )
    sched.run()
    sched.cache_manager.check_integrity()
    assert sched.table_manager.available_size == 16
    sched.shutdown()
    by_uid = {uid: [r for r in replies if r.uid == uid] for uid in range(5)}
    for uid, bad in ((0, vocab), (2, -1)):
        (refusal,) = by_uid[uid]
        assert refusal.finished and refusal.next_token == -1
        assert f"token id {bad} at position" in refusal.error and "ids 0 to 49151" in refusal.error
    (nothing,) = by_uid[3]
    assert nothing.finished and nothing.next_token == -1 and nothing.error is None
    assert len(sched.outputs[1]) == 4 and sched.outputs[4] == sched.outputs[1]
