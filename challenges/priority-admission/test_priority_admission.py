"""Checker of the priority-admission challenge: the ranking and blocking rules against a model
of them on random workloads (the admission half of the scheduler, no model weights), a partly
prefilled request first, and one run through the real scheduler."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Dict, List

import pytest
import torch

from examples.helpers import scripted
from minisgl.core import Req
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import ChunkedReq
from minisgl.scheduler.table import TableManager
from tools.parity import hf_references

# like the chapters' tests: on the CPU, where the references from transformers are made
os.environ["MINISGL_DEVICE"] = "cpu"
os.environ["MINISGL_BOOK_DEVICE"] = "cpu"

NO_BUDGET_LIMIT = 1 << 20  # the model below leaves chunking out: every prompt is admitted whole


@dataclass
class Arrival:
    round: int
    uid: int
    prompt_len: int
    max_tokens: int
    hold: int  # rounds it runs once admitted, before it finishes


@dataclass
class Waiting:
    arrival: int
    priority: int
    need: int  # token slots its whole future takes (pages of one token, nothing cached)
    waited: int = 0


def model_admission(waiting: Dict[int, Waiting], max_wait: int, room: int, slots: int) -> List[int]:
    """Rules 1 and 2: rank, then admit along the ranking up to the first that does not fit."""

    def rank(uid: int):
        w = waiting[uid]
        return (0, 0, w.arrival) if w.waited >= max_wait else (1, -w.priority, w.arrival)

    admitted: List[int] = []
    for uid in sorted(waiting, key=rank):
        if len(admitted) == slots or waiting[uid].need > room:
            break
        admitted.append(uid)
        room -= waiting[uid].need
    return admitted


def simulate(candidate, arrivals: List[Arrival], priority: Dict[int, int], max_wait: int) -> None:
    """Rounds of admission: requests arrive, the manager admits, admitted requests hold their
    slot and memory for `hold` rounds, then finish. Each round is compared with the model."""
    pool, slots = 40, 3
    table = torch.zeros(slots + 1, 64, dtype=torch.int32)
    cache = CacheManager(pool, 1, table, "naive")
    tables = TableManager(slots, table)
    decode = DecodeManager(1)
    manager = candidate.PriorityPrefillManager(
        cache, tables, decode, priority=dict(priority), max_wait=max_wait
    )
    hold = {a.uid: a.hold for a in arrivals}
    waiting: Dict[int, Waiting] = {}
    ends: Dict[Req, int] = {}  # running request -> the round it finishes
    arrived = 0
    for rnd in range(200):
        for req in [r for r, end in ends.items() if end == rnd]:
            del ends[req]
            decode.remove_req(req)
            tables.free(req.table_idx)
            cache.cache_req(req, finished=True)
        for a in arrivals:
            if a.round == rnd:
                prompt = list(range(3, 3 + a.prompt_len))
                manager.add_one_req(scripted.user_msg(a.uid, prompt, a.max_tokens))
                waiting[a.uid] = Waiting(
                    arrived, priority.get(a.uid, 0), a.prompt_len + a.max_tokens
                )
                arrived += 1
        if arrived == len(arrivals) and not waiting and not ends:
            break
        room, slots_free = cache.available_size - decode.inflight_tokens, tables.available_size
        expected = model_admission(waiting, max_wait, room, slots_free)
        table_text = ", ".join(
            f"{uid}: priority {w.priority}, waited {w.waited}, needs {w.need}"
            for uid, w in sorted(waiting.items(), key=lambda kv: kv[1].arrival)
        )
        batch = manager.schedule_next_batch(NO_BUDGET_LIMIT)
        got = [r.uid for r in batch.reqs] if batch is not None else []
        assert got == expected, (
            f"K={max_wait}, round {rnd}: admitted {got}, the rules admit {expected}; waiting "
            f"in arrival order ({table_text}); {room} token slots free for new requests, "
            f"{slots_free} request slots"
        )
        for req in batch.reqs if batch is not None else []:
            assert not isinstance(req, ChunkedReq), "no budget limit here: nothing is cut"
            cache.allocate_paged([req])
            req.complete_one()  # its prefill ran
            decode.filter_reqs([req])
            ends[req] = rnd + hold[req.uid]
            del waiting[req.uid]
        for w in waiting.values():
            w.waited += 1
    assert not waiting and not ends, "requests still waiting or running after 200 rounds"
    assert len(manager.pending_list) == 0, "admitted requests are still in pending_list"
    cache.check_integrity()


def random_workload(seed: int):
    rng = random.Random(seed)
    uids = rng.sample(range(100, 200), 14)  # arrival order is not the order of the uids
    arrivals = sorted(
        (
            Arrival(
                rng.randint(0, 10), uid, rng.randint(1, 10), rng.randint(1, 10), rng.randint(1, 4)
            )
            for uid in uids
        ),
        key=lambda a: a.round,  # stable: within a round, the order of the list is the arrival order
    )
    priority = {uid: rng.choice([-1, 0, 1, 2, 5]) for uid in uids if rng.random() < 0.8}
    return arrivals, priority


@pytest.mark.parametrize("max_wait", [0, 1, 3, 50])
def test_ranking_blocking_and_aging_on_random_workloads(candidate, max_wait: int) -> None:
    for seed in range(12):
        arrivals, priority = random_workload(1000 * max_wait + seed)
        simulate(candidate, arrivals, priority, max_wait)


def test_a_partly_prefilled_request_continues_before_any_priority(candidate) -> None:
    table = torch.zeros(5, 64, dtype=torch.int32)
    cache = CacheManager(200, 1, table, "naive")
    manager = candidate.PriorityPrefillManager(
        cache, TableManager(4, table), DecodeManager(1), priority={1: 9}, max_wait=50
    )

    def run(budget: int):
        batch = manager.schedule_next_batch(budget)
        assert batch is not None
        pieces = [(r.uid, r.extend_len, isinstance(r, ChunkedReq)) for r in batch.reqs]
        for req in batch.reqs:
            cache.allocate_paged([req])
            req.complete_one()  # the piece ran
        return pieces

    manager.add_one_req(scripted.user_msg(0, list(range(3, 23)), 4))  # 20 tokens, priority 0
    assert run(8) == [(0, 8, True)]
    manager.add_one_req(scripted.user_msg(1, [5, 6, 7], 4))  # priority 9
    assert run(10) == [(0, 10, True)], "the partly prefilled request must continue first"
    assert run(10) == [(0, 2, False), (1, 3, False)]


class PriorityScheduler(scripted.ScriptedScheduler):
    """The real scheduler with the candidate's manager; records the order of admission."""

    def __init__(self, candidate, config, arrivals, priority: Dict[int, int], max_wait: int):
        super().__init__(config, arrivals)
        self.prefill_manager = candidate.PriorityPrefillManager(
            self.cache_manager,
            self.table_manager,
            self.decode_manager,
            priority=priority,
            max_wait=max_wait,
        )
        self.admitted: List[int] = []

    def _forward(self, forward_input):
        for req in forward_input.batch.reqs:
            if req.uid not in self.admitted:
                self.admitted.append(req.uid)
        return super()._forward(forward_input)


@pytest.mark.parametrize("max_wait, order", [(50, [0, 1, 4, 5, 2, 3]), (2, [0, 1, 4, 2, 3, 5])])
def test_through_the_scheduler(candidate, max_wait: int, order: List[int]) -> None:
    """Requests 0 to 3 (priority 0) arrive at step 0, with memory for two of them; at step 1,
    request 4 (priority 5) and request 5 (priority 1). With a budget of 8, request 1 is
    prefilled in two pieces, and request 4 fits beside its second piece. With K=2, requests 2
    and 3 have waited two rounds by the time memory frees again, and go before request 5."""
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 40000, (6,), generator=g).tolist() for _ in range(6)]
    arrivals = [
        (0 if uid < 4 else 1, scripted.user_msg(uid, p, 4)) for uid, p in enumerate(prompts)
    ]
    config = scripted.make_config("tiny-qwen3", num_page_override=30, max_extend_tokens=8)
    sched = PriorityScheduler(candidate, config, arrivals, {4: 5, 5: 1}, max_wait)
    try:
        outputs = sched.run()
        sched.cache_manager.check_integrity()
        assert sched.table_manager.available_size == config.max_running_req
    finally:
        sched.shutdown()
    assert sched.admitted == order, f"K={max_wait}: admitted in the order {sched.admitted}"
    references = hf_references("tiny-qwen3", prompts, 4)
    for uid, ref in enumerate(references):
        assert outputs[uid] == ref.tokens, f"request {uid}: {outputs[uid]} != {ref.tokens}"
