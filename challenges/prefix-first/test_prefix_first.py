"""Checker of the prefix-first challenge: the ranking of one round against a radix cache that
holds two prompts, a partly prefilled request first, and a workload through the real scheduler
on which first come, first served computes far more prompt tokens."""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import pytest
import torch

from examples.helpers import scripted
from minisgl.core import Context, clear_global_ctx, set_global_ctx
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import ChunkedReq
from minisgl.scheduler.table import TableManager
from tools.parity import hf_references

# like the chapters' tests: on the CPU, where the references from transformers are made
os.environ["MINISGL_DEVICE"] = "cpu"
os.environ["MINISGL_BOOK_DEVICE"] = "cpu"

S = list(range(1000, 1030))  # 30 tokens in the cache
T = list(range(2000, 2010))  # 10 tokens in the cache


def radix_manager(candidate, pool: int, slots: int):
    """The candidate's manager over a radix cache (pages of one token) that holds S and T."""
    clear_global_ctx()
    set_global_ctx(Context(page_size=1))  # where the radix cache reads its page size
    try:
        table = torch.zeros(slots + 1, 128, dtype=torch.int32)
        cache = CacheManager(pool, 1, table, "radix")
    finally:
        clear_global_ctx()
    for ids in (S, T):
        cache.prefix_cache.insert_prefix(torch.tensor(ids), cache._allocate(len(ids)))
    manager = candidate.PrefixFirstPrefillManager(
        cache, TableManager(slots, table), DecodeManager(1)
    )
    return manager, cache


# uid -> (prompt, max_tokens), in arrival order; the comment is what the cache holds of it
ROUND = {
    10: ([500, 501, 502, 503, 504, 505], 4),  # nothing
    11: (T + [7, 7], 4),  # 10 tokens
    12: (S + [9], 4),  # 30 tokens
    13: (T + [8], 4),  # 10 tokens (its last token is never matched)
    14: (S[:20] + [4, 4, 4], 4),  # 20 tokens
}


def admit_one_round(candidate, max_tokens_of_14: int) -> List[int]:
    manager, cache = radix_manager(candidate, pool=100, slots=4)
    for uid, (prompt, max_tokens) in ROUND.items():
        n = max_tokens_of_14 if uid == 14 else max_tokens
        manager.add_one_req(scripted.user_msg(uid, prompt, n))
    batch = manager.schedule_next_batch(1000)
    return [r.uid for r in batch.reqs] if batch is not None else []


def test_longest_cached_prefix_first_ties_in_arrival_order(candidate) -> None:
    # four request slots: the fifth, with nothing cached, waits
    assert admit_one_round(candidate, max_tokens_of_14=4) == [12, 14, 11, 13]


def test_a_request_that_does_not_fit_blocks_those_ranked_after_it(candidate) -> None:
    # request 14 now needs 73 slots; after 12, 70 are left (its 30 cached tokens are locked)
    assert admit_one_round(candidate, max_tokens_of_14=70) == [12]


def test_a_partly_prefilled_request_continues_first(candidate) -> None:
    manager, cache = radix_manager(candidate, pool=200, slots=4)

    def run(budget: int) -> List[Tuple[int, int, bool]]:
        batch = manager.schedule_next_batch(budget)
        assert batch is not None
        pieces = [(r.uid, r.extend_len, isinstance(r, ChunkedReq)) for r in batch.reqs]
        for req in batch.reqs:
            cache.allocate_paged([req])
            req.complete_one()  # the piece ran
        return pieces

    manager.add_one_req(scripted.user_msg(0, list(range(3, 23)), 4))  # 20 tokens, none cached
    assert run(8) == [(0, 8, True)]
    manager.add_one_req(scripted.user_msg(1, S + [9], 4))  # 30 of its 31 tokens cached
    assert run(10) == [(0, 10, True)], "the partly prefilled request must continue first"
    assert run(10) == [(0, 2, False), (1, 1, False)]


class CountingScheduler(scripted.ScriptedScheduler):
    """The real scheduler, with the candidate's manager or the plain one (first come, first
    served); counts the prompt tokens its prefills compute."""

    def __init__(self, config, arrivals, manager_class=None) -> None:
        super().__init__(config, arrivals)
        if manager_class is not None:
            self.prefill_manager = manager_class(
                self.cache_manager, self.table_manager, self.decode_manager
            )
        self.computed = 0

    def _forward(self, forward_input):
        if forward_input.batch.is_prefill:
            self.computed += sum(r.extend_len for r in forward_input.batch.reqs)
        return super()._forward(forward_input)


def workload() -> List[List[int]]:
    """Two conversations' worth of prompts, interleaved: A, B, A, B, A, B. Each is a 40-token
    prefix of its family and 3 tokens of its own."""
    g = torch.Generator().manual_seed(9)
    families = [torch.randint(3, 40000, (40,), generator=g).tolist() for _ in range(2)]
    return [families[i % 2] + torch.randint(3, 40000, (3,), generator=g).tolist() for i in range(6)]


def run(prompts: List[List[int]], manager_class) -> Tuple[int, Dict[int, List[int]]]:
    # one request at a time, in 16 pages of 4 tokens: the cache keeps one family's prefix
    config = scripted.make_config(
        "tiny-qwen3", max_running_req=1, page_size=4, num_page_override=16
    )
    arrivals = [(0, scripted.user_msg(uid, p, 3)) for uid, p in enumerate(prompts)]
    sched = CountingScheduler(config, arrivals, manager_class)
    try:
        outputs = sched.run()
        sched.cache_manager.check_integrity()
        assert sched.table_manager.available_size == 1, "a request slot was not given back"
        assert sched.cache_manager.prefix_cache.size_info.protected_size == 0, "still locked"
        assert not sched.prefill_manager.pending_list, "requests left waiting"
    finally:
        sched.shutdown()
    return sched.computed, outputs


@pytest.fixture(scope="module")
def fifo():
    prompts = workload()
    return run(prompts, None)


def test_fewer_prompt_tokens_than_first_come_first_served(candidate, fifo) -> None:
    prompts = workload()
    computed, outputs = run(prompts, candidate.PrefixFirstPrefillManager)
    fifo_computed, fifo_outputs = fifo
    references = hf_references("tiny-qwen3", prompts, 3)
    for uid, ref in enumerate(references):
        assert fifo_outputs[uid] == ref.tokens, "the plain engine itself disagrees"
        assert outputs[uid] == ref.tokens, f"request {uid}: {outputs[uid]} != {ref.tokens}"
    assert computed < fifo_computed, (
        f"{computed} prompt tokens computed, first come first served computes {fifo_computed}"
    )
