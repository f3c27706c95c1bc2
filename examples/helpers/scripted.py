"""A scheduler driven by a script of arrivals instead of messages, and the helpers that make
its requests (chapter 07). Chapters 08 to 11 drive their schedulers with it."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.message import BaseBackendMsg, DetokenizeMsg, UserMsg
from minisgl.scheduler import Scheduler, SchedulerConfig
from tools.models import ensure_model
from tools.parity import book_dtype


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
        offline_mode=True,  # the script plays the clients: no sockets (chapter 14)
    )
    base.update(kwargs)
    return SchedulerConfig(**base)


def user_msg(uid: int, prompt: List[int], max_tokens: int, **params) -> UserMsg:
    return UserMsg(
        uid,
        torch.tensor(prompt, dtype=torch.int32),
        SamplingParams(max_tokens=max_tokens, **params),
    )
