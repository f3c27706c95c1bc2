"""The scheduler in a process of its own, fed over ZMQ sockets (chapter 12; chapter 14 builds
the same into the scheduler as SchedulerIOMixin). Chapter 13's main runs it too."""

from __future__ import annotations

from typing import List

import torch

from minisgl.distributed import DistributedInfo
from minisgl.message import BaseBackendMsg, BaseTokenizerMsg, BatchTokenizerMsg, DetokenizeMsg
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import ZmqPullQueue, ZmqPushQueue, make_stoppable


class SocketScheduler(Scheduler):
    """The scheduler's two hooks over sockets (chapter 14 builds this into the scheduler)."""

    def __init__(self, config: SchedulerConfig, backend_addr: str, detokenizer_addr: str) -> None:
        super().__init__(config)
        self.inbox = ZmqPullQueue(backend_addr, create=True, decoder=BaseBackendMsg.decoder)
        self.outbox = ZmqPushQueue(detokenizer_addr, create=False, encoder=BaseTokenizerMsg.encoder)

    def offline_receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        messages = [self.inbox.get()] if blocking else []
        while not self.inbox.empty():
            messages.append(self.inbox.get())
        return messages

    def offline_send_result(self, reply: List[DetokenizeMsg]) -> None:
        if len(reply) == 1:
            self.outbox.put(reply[0])
        elif reply:
            self.outbox.put(BatchTokenizerMsg(reply))


def serve(model_path: str, dtype: str, backend_addr: str, detokenizer_addr: str) -> None:
    """The scheduler process: runs until an ExitMsg arrives (or a signal, or its parent's
    death: make_stoppable)."""
    make_stoppable()
    config = SchedulerConfig(
        model_path=model_path,
        tp_info=DistributedInfo(0, 1),
        dtype=getattr(torch, dtype),
        offline_mode=True,
        max_running_req=8,
        num_page_override=2048,
    )
    scheduler = SocketScheduler(config, backend_addr, detokenizer_addr)
    try:
        scheduler.run_forever()
    except KeyboardInterrupt:  # what an ExitMsg raises
        pass
    scheduler.shutdown()
    scheduler.inbox.stop()
    scheduler.outbox.stop()
