"""Checker of the adaptive-chunk challenge: the real scheduler, with the candidate choosing
every batch, on a workload whose decode load changes while long prompts are cut.
Every step's tokens are recorded and judged."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Set

import torch

from examples.helpers import scripted
from minisgl.scheduler.prefill import ChunkedReq
from tools.parity import hf_references

# like the chapters' tests: on the CPU, where the references from transformers are made
os.environ["MINISGL_DEVICE"] = "cpu"
os.environ["MINISGL_BOOK_DEVICE"] = "cpu"

T = 10  # the most tokens one step may compute


@dataclass
class Piece:
    uid: int
    tokens: int
    chunk: bool  # a ChunkedReq: part of a prompt that is not done after it


class StepScheduler(scripted.ScriptedScheduler):
    """The real scheduler; the candidate chooses every batch, and every batch is recorded."""

    def __init__(self, candidate, config, arrivals) -> None:
        super().__init__(config, arrivals)
        self.schedule_step = candidate.schedule_step
        self.steps: List[List[Piece]] = []

    def _schedule_next_batch(self):
        batch = self.schedule_step(self.prefill_manager, self.decode_manager, T)
        return self._prepare_batch(batch) if batch is not None else None

    def _forward(self, forward_input):
        reqs = forward_input.batch.reqs
        self.steps.append([Piece(r.uid, r.extend_len, isinstance(r, ChunkedReq)) for r in reqs])
        return super()._forward(forward_input)


def workload():
    """Two requests decode while a 64-token prompt arrives; later ten one-token prompts fill
    the whole budget with decoding, a 40-token prompt arrives behind them, and the burst
    finishes one request at a time."""
    g = torch.Generator().manual_seed(10)
    ids = lambda n: torch.randint(3, 40000, (n,), generator=g).tolist()
    plan = [(0, ids(5), 6), (0, ids(3), 14), (2, ids(64), 5), (3, ids(4), 8)]
    plan += [(20, ids(1), 3 + i) for i in range(10)]
    plan += [(21, ids(40), 4)]
    return plan


def judge(steps: List[List[Piece]], outputs: Dict[int, List[int]]) -> None:
    last_piece: Dict[int, int] = {}  # uid -> the step of its prompt's last piece
    partly: Set[int] = set()  # prompts with a piece run and their last piece still to come
    for i, step in enumerate(steps):
        total = sum(p.tokens for p in step)
        decoding = [p for p in step if p.uid in last_piece]
        pieces = {p.uid: p for p in step if p.uid not in last_piece}
        shown = ", ".join(f"r{p.uid}:{p.tokens}{'+' if p.chunk else ''}" for p in step)
        # rule 1
        assert total <= T, f"step {i} computes {total} tokens, more than {T}: {shown}"
        # rule 3
        if len(decoding) < T:
            for uid in partly:
                assert uid in pieces, f"step {i} has room, but r{uid}'s prompt waits: {shown}"
                assert total == T or not pieces[uid].chunk, (
                    f"step {i} computes {total} of {T} tokens; r{uid}'s prompt could use the "
                    f"rest: {shown}"
                )
        for uid, p in pieces.items():
            if p.chunk:
                partly.add(uid)
            else:
                partly.discard(uid)
                last_piece[uid] = i
    assert not partly, f"prompts never finished: {sorted(partly)}"
    # rule 2
    for uid, first in last_piece.items():
        for k in range(1, len(outputs[uid])):
            assert first + k < len(steps), f"r{uid} got {len(outputs[uid])} tokens in fewer steps"
            step = steps[first + k]
            assert any(p.uid == uid and p.tokens == 1 for p in step), (
                f"r{uid} decodes from step {first + 1}, but step {first + k} leaves it out"
            )


def test_step_budget_continuous_decoding_and_progress(candidate) -> None:
    plan = workload()
    arrivals = [(when, scripted.user_msg(uid, p, n)) for uid, (when, p, n) in enumerate(plan)]
    config = scripted.make_config("tiny-qwen3", page_size=4, num_page_override=256)
    sched = StepScheduler(candidate, config, arrivals)
    try:
        outputs = sched.run()
        sched.cache_manager.check_integrity()
        assert sched.table_manager.available_size == config.max_running_req
    finally:
        sched.shutdown()
    assert sorted(outputs) == list(range(len(plan))), "not every request was answered"
    judge(sched.steps, outputs)
    # rule 4
    references = hf_references("tiny-qwen3", [p for _, p, _ in plan], 14)
    for uid, ((_, _, n), ref) in enumerate(zip(plan, references)):
        assert outputs[uid] == ref.tokens[:n], f"r{uid}: {outputs[uid]} != {ref.tokens[:n]}"
