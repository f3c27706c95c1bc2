"""The scheduler ranks of one model under tensor parallelism (chapter 16), fed and read the way
chapter 14's main feeds one scheduler: this process plays the tokenizer and the detokenizer,
and talks to rank 0 only. Rank 0 forwards every message to the other ranks, so all of them run
the same batches; only rank 0 replies.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import replace
from typing import Callable, Dict, List

import torch

from examples.helpers.scheduler_process import run_scheduler
from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.message import (
    BaseBackendMsg,
    BaseTokenizerMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    ExitMsg,
    UserMsg,
)
from minisgl.scheduler import SchedulerConfig
from minisgl.server.launch import remove_leftover_files
from minisgl.utils import ZmqPullQueue, ZmqPushQueue, worker_context
from tools.processes import finish, receive, stopped_on_exit

REPLY_TIMEOUT_S = 120  # ranks that send nothing for this long are stuck


class Ranks:
    """`config.tp_info.size` scheduler processes, one per rank, gone when the block ends. Each
    runs `target(its config, ready)`: `run_scheduler`, or a benchmark's version of it."""

    def __init__(
        self,
        config: SchedulerConfig,
        target: Callable[[SchedulerConfig, mp.Queue], None] = run_scheduler,
    ) -> None:
        self.config = config
        self.requests = ZmqPushQueue(
            config.zmq_backend_addr, create=False, encoder=BaseBackendMsg.encoder
        )
        self.replies = ZmqPullQueue(
            config.zmq_detokenizer_addr, create=False, decoder=BaseTokenizerMsg.decoder
        )
        ctx = worker_context(["minisgl.scheduler"])
        self.ready: mp.Queue = ctx.Queue()
        size = config.tp_info.size
        self.processes = [
            ctx.Process(
                target=target,
                args=(replace(config, tp_info=DistributedInfo(rank, size)), self.ready),
                name=f"rank {rank} of {size}",
            )
            for rank in range(size)
        ]
        for process in self.processes:
            process.start()

    def __enter__(self) -> "Ranks":
        self._stopper = stopped_on_exit(*self.processes)
        self._stopper.__enter__()
        for _ in self.processes:  # every rank has joined the process group and subscribed
            receive(self.ready, self.processes, REPLY_TIMEOUT_S, "the ranks to start")
        return self

    def generate(self, prompts: List[List[int]], max_tokens: int) -> List[List[int]]:
        """Greedy tokens for each prompt, sent in one message to rank 0."""
        msgs = [
            UserMsg(uid, torch.tensor(p, dtype=torch.int32), SamplingParams(max_tokens=max_tokens))
            for uid, p in enumerate(prompts)
        ]
        self.requests.put(BatchBackendMsg(msgs))  # type: ignore[arg-type]
        got: Dict[int, List[int]] = {uid: [] for uid in range(len(prompts))}
        running = set(got)
        while running:
            reply = receive(self.replies, self.processes, REPLY_TIMEOUT_S, "the tokens")
            batch = reply.data if isinstance(reply, BatchTokenizerMsg) else [reply]
            for msg in batch:
                got[msg.uid].append(msg.next_token)
                if msg.finished:
                    running.discard(msg.uid)
        return [got[uid] for uid in range(len(prompts))]

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.requests.put(ExitMsg())  # rank 0 forwards it: every rank stops
                finish(self.processes)
        finally:
            self._stopper.__exit__(*exc)
            self.requests.stop()
            remove_leftover_files(self.config)
            self.replies.stop()
