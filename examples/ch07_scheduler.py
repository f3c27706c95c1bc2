"""Chapter 07: the scheduler and continuous batching.

Requests arrive while others are decoding. Each step the scheduler runs either a prefill of
the requests that just arrived or one decode step of every running request; finished requests
leave at once and free their slot and pages. The trace shows every step's batch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.distributed import DistributedInfo  # noqa: E402
from minisgl.message import BaseBackendMsg, DetokenizeMsg, UserMsg  # noqa: E402
from minisgl.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from tools.models import DEMO_MODEL, ensure_model  # noqa: E402
from tools.parity import book_dtype, load_tokenizer, run_parity  # noqa: E402


class AllDone(Exception):
    """Nothing is running, waiting or still to arrive."""


class ScriptedScheduler(Scheduler):
    """Drives the scheduler with requests that arrive at given steps, and records what it does.

    `arrivals` lists (step, request); a step is one turn of the scheduler's loop.
    """

    def __init__(
        self, config: SchedulerConfig, arrivals: List[Tuple[int, UserMsg]], trace: bool = False
    ) -> None:
        super().__init__(config)
        self.arrivals = sorted(arrivals, key=lambda a: a[0])
        self.step = -1
        self.trace = trace
        self.outputs: Dict[int, List[int]] = {}
        self.finish_step: Dict[int, int] = {}

    def offline_receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        self.step += 1
        if blocking:  # idle: nothing runs until the next request arrives
            if not self.arrivals:
                raise AllDone
            self.run_when_idle()
            self.step = max(self.step, self.arrivals[0][0])
        arrived = [msg for when, msg in self.arrivals if when <= self.step]
        self.arrivals = [(when, msg) for when, msg in self.arrivals if when > self.step]
        return arrived

    def offline_send_result(self, reply: List[DetokenizeMsg]) -> None:
        for msg in reply:
            self.outputs.setdefault(msg.uid, []).append(msg.next_token)
            if msg.finished:
                self.finish_step[msg.uid] = self.step

    def _forward(self, forward_input):
        if self.trace:
            batch = forward_input.batch
            parts = ", ".join(f"r{r.uid}:{r.extend_len}" for r in batch.reqs)
            print(
                f"{self.step:4d}  {batch.phase:7s} {batch.size:5d}  "
                f"{len(self.prefill_manager.pending_list):7d}"
                f"  {self.cache_manager.available_size:10d}  {parts}"
            )
        return super()._forward(forward_input)

    def run(self) -> Dict[int, List[int]]:
        try:
            self.run_forever()
        except AllDone:
            pass
        return self.outputs


def make_config(name: str, **kwargs) -> SchedulerConfig:
    base = dict(
        model_path=str(ensure_model(name)),
        tp_info=DistributedInfo(0, 1),
        dtype=book_dtype(),
        max_running_req=16,
        page_size=1,
        num_page_override=4096,
    )
    base.update(kwargs)
    return SchedulerConfig(**base)


def user_msg(uid: int, prompt: List[int], max_tokens: int, **params) -> UserMsg:
    return UserMsg(
        uid,
        torch.tensor(prompt, dtype=torch.int32),
        SamplingParams(max_tokens=max_tokens, **params),
    )


def show_continuous_batching() -> None:
    tok = load_tokenizer(DEMO_MODEL)
    texts = [
        "The capital of France is",
        "Water boils at",
        "def add(a, b):",
        "The sky is",
        "One, two,",
    ]
    steps, budgets = [0, 0, 3, 4, 9], [6, 3, 5, 4, 3]
    arrivals = [
        (s, user_msg(i, tok(t).input_ids, n))
        for i, (t, s, n) in enumerate(zip(texts, steps, budgets))
    ]
    print(
        "requests: "
        + "; ".join(
            f"r{i} arrives at step {s}, max_tokens={n}"
            for i, (s, n) in enumerate(zip(steps, budgets))
        )
    )
    print("step  phase    reqs  waiting  free slots  (request:new tokens)")
    sched = ScriptedScheduler(make_config(DEMO_MODEL), arrivals, trace=True)
    outputs = sched.run()
    for uid in sorted(outputs):
        print(f"  r{uid} finished at step {sched.finish_step[uid]}: {tok.decode(outputs[uid])!r}")
    sched.shutdown()
    print()


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    """Staggered arrivals: prompt i arrives at step 3*i, while the earlier ones decode."""
    arrivals = [(3 * i, user_msg(i, p, n)) for i, p in enumerate(prompts)]
    sched = ScriptedScheduler(make_config(name), arrivals)
    try:
        outputs = sched.run()
    finally:
        sched.shutdown()
    return [outputs[i] for i in range(len(prompts))]


def main() -> int:
    show_continuous_batching()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
