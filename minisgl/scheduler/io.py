"""Where the scheduler's messages come from and where its replies go.

Offline (`LLM`, the book's scripted drivers), a subclass provides `offline_receive_msg` and
`offline_send_result`. Online, the scheduler is a process of its own, driven only by messages:

    tokenizers --PUSH--> backend addr --PULL--> rank 0 --PUSH--> detokenizer addr --> detokenizer
                                                  |
                                                  PUB (waits for tp_size - 1 subscribers)
                                                  v
                                                 SUB  ranks 1 .. tp_size-1 (no replies)

With tensor parallelism (chapter 16) every rank computes a slice of every batch, so every rank
must make the same decisions at every step: the same messages, at the same turn of its loop.
Rank 0 forwards each message's bytes to the other ranks and, once per turn, broadcasts over
the CPU process group how many it forwarded; the others read exactly that many.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Tuple, TypeVar

import torch

from minisgl.message import BaseBackendMsg, BaseTokenizerMsg, BatchTokenizerMsg, DetokenizeMsg
from minisgl.utils import ZmqPubQueue, ZmqPullQueue, ZmqPushQueue, ZmqSubQueue, init_logger

if TYPE_CHECKING:
    import torch.distributed

    from .config import SchedulerConfig

logger = init_logger(__name__)
Q = TypeVar("Q", ZmqPullQueue, ZmqPushQueue, ZmqPubQueue, ZmqSubQueue)


class SchedulerIOMixin:
    """Sets `receive_msg` and `send_result`, the two hooks of the scheduler's loop, for the
    scheduler's mode and rank; `sync_all_ranks` holds every rank until all are ready."""

    def __init__(
        self, config: SchedulerConfig, tp_cpu_group: torch.distributed.ProcessGroup | None
    ) -> None:
        self.tp_cpu_group = tp_cpu_group
        self._queues: List[ZmqPullQueue | ZmqPushQueue | ZmqPubQueue | ZmqSubQueue] = []  # to close
        self._subscribe_timeout = config.distributed_timeout
        if config.offline_mode:
            self.receive_msg = self.offline_receive_msg
            self.send_result = self.offline_send_result
            return
        tp_info = config.tp_info
        if tp_info.size > 1 and tp_cpu_group is None:
            raise ValueError("several ranks need a CPU process group to agree on each turn")
        receive, send = self._recv_msg_single_rank, self._reply_tokenizer_rank0
        if tp_info.is_primary():
            self._recv_from_tokenizer = self._keep(
                ZmqPullQueue(config.zmq_backend_addr, create=True, decoder=BaseBackendMsg.decoder)
            )
            self._send_into_tokenizer = self._keep(
                ZmqPushQueue(
                    config.zmq_detokenizer_addr,
                    create=config.backend_create_detokenizer_link,
                    encoder=BaseTokenizerMsg.encoder,
                )
            )
        if tp_info.size > 1 and tp_info.is_primary():
            receive = self._recv_msg_multi_rank0
            self._send_into_ranks = self._keep(
                ZmqPubQueue(
                    config.zmq_scheduler_broadcast_addr,
                    create=True,
                    encoder=BaseBackendMsg.encoder,
                    num_subscribers=tp_info.size - 1,
                    timeout=config.distributed_timeout,
                )
            )
        elif tp_info.size > 1:
            receive, send = self._recv_msg_multi_rank1, self._reply_tokenizer_rank1
            self._recv_from_rank0 = self._keep(
                ZmqSubQueue(
                    config.zmq_scheduler_broadcast_addr,
                    create=False,
                    decoder=BaseBackendMsg.decoder,
                )
            )
        self.receive_msg = receive
        self.send_result = send

    # ------------------------------------------------------------ what a subclass provides
    def run_when_idle(self) -> None:
        raise NotImplementedError("the scheduler says what to do while it waits")

    def offline_receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        raise NotImplementedError("a driver of the scheduler provides its messages")

    def offline_send_result(self, reply: List[DetokenizeMsg]) -> None:
        raise NotImplementedError("a driver of the scheduler takes its results")

    # ---------------------------------------------------------------------------- ranks
    def sync_all_ranks(self) -> None:
        """Return once every rank has started: rank 0 first waits for the other ranks'
        subscriptions (a TimeoutError after distributed_timeout seconds says how many came),
        then all ranks meet at a barrier."""
        if hasattr(self, "_send_into_ranks"):
            self._send_into_ranks.wait_for_subscribers(timeout=self._subscribe_timeout)
        if self.tp_cpu_group is not None:
            torch.distributed.barrier(group=self.tp_cpu_group)

    def _count_for_all_ranks(self, count: int) -> int:
        """Rank 0's `count`, on every rank."""
        value = torch.tensor([count], dtype=torch.int64)
        torch.distributed.broadcast(value, src=0, group=self.tp_cpu_group)
        return int(value.item())

    # ---------------------------------------------------------------------- receiving
    def _decoded(self, raw: bytes) -> BaseBackendMsg | None:
        """The message, or None for one that cannot be decoded (logged and dropped: nothing
        a client sends may end the scheduler)."""
        try:
            return self._recv_from_tokenizer.decode(raw)
        except (ValueError, TypeError, KeyError) as error:
            logger.warning(f"dropped a message that cannot be decoded: {error}")
            return None

    def _take_from_tokenizer(self, blocking: bool) -> List[Tuple[bytes, BaseBackendMsg]]:
        """Every message that has arrived, as (bytes, message); when `blocking`, first wait
        (after run_when_idle) until one that can be decoded comes."""
        taken: List[Tuple[bytes, BaseBackendMsg]] = []

        def take_one() -> None:
            raw = self._recv_from_tokenizer.get_raw()
            if (msg := self._decoded(raw)) is not None:
                taken.append((raw, msg))

        if blocking:
            self.run_when_idle()
            while not taken:
                take_one()
        while not self._recv_from_tokenizer.empty():
            take_one()
        return taken

    def _recv_msg_single_rank(self, blocking: bool = False) -> List[BaseBackendMsg]:
        return [msg for _, msg in self._take_from_tokenizer(blocking)]

    def _recv_msg_multi_rank0(self, blocking: bool = False) -> List[BaseBackendMsg]:
        taken = self._take_from_tokenizer(blocking)
        if blocking:  # the others wait on their SUB socket for the one that woke us
            self._forward_to_ranks(taken[0][0])
        rest = taken[1:] if blocking else taken
        self._count_for_all_ranks(len(rest))
        for raw, _ in rest:
            self._forward_to_ranks(raw)
        return [msg for _, msg in taken]

    def _forward_to_ranks(self, raw: bytes) -> None:
        """Send a message's bytes to the other ranks. Every rank subscribed before the first
        turn (sync_all_ranks), and none leaves while the server runs: a departure means a
        rank has died, so rank 0 fails at once instead of waiting distributed_timeout seconds
        for a subscriber that cannot come back."""
        try:  # one look at the subscribers, in the same call as the send
            self._send_into_ranks.put_raw(raw, timeout=0)
        except TimeoutError as error:
            raise RuntimeError(f"another rank has stopped ({error})") from None

    def _recv_msg_multi_rank1(self, blocking: bool = False) -> List[BaseBackendMsg]:
        messages: List[BaseBackendMsg] = []
        if blocking:
            self.run_when_idle()
            messages.append(self._recv_from_rank0.get())
        for _ in range(self._count_for_all_ranks(-1)):
            messages.append(self._recv_from_rank0.get())
        return messages

    # ------------------------------------------------------------------------ replying
    def _reply_tokenizer_rank0(self, reply: List[DetokenizeMsg]) -> None:
        if len(reply) == 1:
            self._send_into_tokenizer.put(reply[0])
        elif reply:
            self._send_into_tokenizer.put(BatchTokenizerMsg(data=reply))  # type: ignore[arg-type]

    def _reply_tokenizer_rank1(self, reply: List[DetokenizeMsg]) -> None:
        pass  # rank 0 replies for all

    def _keep(self, queue: Q) -> Q:
        self._queues.append(queue)
        return queue

    def stop_io(self) -> None:
        """Close the sockets (their addresses may be bound again by the next scheduler)."""
        for queue in self._queues:
            queue.stop()
        self._queues = []
