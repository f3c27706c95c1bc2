"""Chapter 14: the scheduler's input and output. Addresses of its own per config; a scheduler
process driven only by messages (serving, refusing, aborting, dropping what cannot be decoded,
exiting cleanly); rank 0 broadcasting each turn's messages to another rank, in order, and
saying so when a rank never comes."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from typing import Dict, List

import pytest
import torch

import minisgl.scheduler.config as scheduler_config
from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.message import (
    AbortBackendMsg,
    BaseBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    UserMsg,
)
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.io import SchedulerIOMixin
from minisgl.utils import ZmqPushQueue, ZmqSubQueue, make_stoppable, worker_context
from tests.support import load_example
from tools.models import ensure_model
from tools.processes import finish, receive, stopped_on_exit

ch14 = load_example("examples/ch14_io.py")


def config(**kwargs) -> SchedulerConfig:
    base = dict(
        model_path=str(ensure_model("tiny-qwen3")),
        tp_info=DistributedInfo(0, 1),
        dtype=torch.float32,
        max_running_req=4,
        page_size=4,
        num_page_override=64,
    )
    base.update(kwargs)
    return SchedulerConfig(**base)


def test_every_config_has_addresses_of_its_own() -> None:
    a, b = config(), config()
    fields = ("zmq_backend_addr", "zmq_detokenizer_addr", "zmq_scheduler_broadcast_addr")
    addresses = [getattr(c, f) for c in (a, b) for f in fields]
    assert len(set(addresses)) == 6  # nothing shared between the two, nor within one
    assert all(len(addr) <= 104 for addr in addresses)  # a Unix socket path's limit (macOS)
    assert str(os.getpid()) in a.zmq_backend_addr  # another process gets others
    rank1 = replace(a, tp_info=DistributedInfo(1, 2))
    assert [getattr(rank1, f) for f in fields] == addresses[:3]  # one server's ranks share them


def test_a_pid_that_comes_back_gets_new_addresses(monkeypatch) -> None:
    """A pid is used again once the system has used the others (32,768 here), and a killed
    server leaves its files behind. Chapter 16's ranks meet in such a file: a new server that
    met in the old one would read the dead ranks' ports (gloo: "connection refused")."""
    first = config()
    count = int(first._unique_suffix.split("-")[1])
    monkeypatch.setattr(scheduler_config, "_COUNTER", itertools.count(count))  # same pid, count
    again = config()
    assert again._unique_suffix.split("-")[:2] == first._unique_suffix.split("-")[:2]
    assert again.zmq_backend_addr != first.zmq_backend_addr


def user(uid: int, prompt: List[int], n: int) -> UserMsg:
    return UserMsg(uid, torch.tensor(prompt, dtype=torch.int32), SamplingParams(max_tokens=n))


def test_a_scheduler_process_serves_refuses_aborts_and_drops_garbage(model_path) -> None:
    """Greedy tokens equal step 0's; a bad token id is refused with the reason; an aborted
    request sends nothing more; bytes that are no message are dropped and the scheduler goes
    on. It then goes idle (where it checks that every page is free or cached: a failure would
    end it) and exits with code 0 on an ExitMsg."""
    step0 = load_example("examples/ch00_step0.py").Step0Model(model_path("tiny-qwen3"))
    client = ch14.SchedulerClient("tiny-qwen3")
    got: Dict[int, List[DetokenizeMsg]] = {uid: [] for uid in range(4)}

    def take(timeout: float) -> None:
        reply = receive(client.replies, [client.process], timeout, "a reply")
        for msg in reply.data if isinstance(reply, BatchTokenizerMsg) else [reply]:
            got[msg.uid].append(msg)

    with client:
        client.requests.put(user(2, [9, 10, 11, 12], 200))
        take(60)  # r2 runs: its first token is here
        client.requests.put(AbortBackendMsg(2))
        client.requests.socket.send(b"\x93not a message")
        client.requests.put(user(0, [5, 6, 7], 6))
        client.requests.put(user(1, [5, 49152], 4))
        client.requests.put(user(3, [8, 9], 4))
        while not all(got[uid] and got[uid][-1].finished for uid in (0, 1, 3)):
            take(60)
        aborted_at = len(got[2])
        with pytest.raises(TimeoutError):  # nothing more comes, for r2 or anyone
            take(1.0)
    tokens = {uid: [m.next_token for m in msgs] for uid, msgs in got.items()}
    assert tokens[0] == step0.generate([5, 6, 7], 6) and tokens[3] == step0.generate([8, 9], 4)
    assert got[1][-1].finished and "token id 49152 at position 1" in got[1][-1].error
    assert 1 <= aborted_at < 200 and not any(m.finished for m in got[2])
    assert tokens[2] == step0.generate([9, 10, 11, 12], aborted_at)


# ----------------------------------------------------------------------------- several ranks
class Ranks(SchedulerIOMixin):
    """Only the scheduler's input and output, on one rank of two."""

    def run_when_idle(self) -> None:
        pass


def rank_main(
    rank: int, store: str, cfg: SchedulerConfig, turns: List[bool], out: mp.Queue
) -> None:
    """Join a two-rank CPU group, then take `turns` turns of receive_msg (each blocking or
    not), reporting (rank, turn, uids) after each."""
    make_stoppable()
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    try:
        io = Ranks(replace(cfg, tp_info=DistributedInfo(rank, 2)), torch.distributed.group.WORLD)
        try:
            io.sync_all_ranks()
            out.put((rank, -1, []))
            for turn, blocking in enumerate(turns):
                out.put((rank, turn, [msg.uid for msg in io.receive_msg(blocking=blocking)]))
        finally:  # a failing receive too: rank 0's sockets leave files until they are closed
            io.stop_io()
    finally:
        torch.distributed.destroy_process_group()


def test_rank0_forwards_each_turns_messages_to_the_other_rank_in_order(tmp_path) -> None:
    cfg = config()
    turns = [True, False, True, False, True]  # block, take what is there, block, take, block
    out: mp.Queue = worker_context([__name__]).Queue()
    store = str(tmp_path / "store")
    ranks = [
        worker_context([__name__]).Process(target=rank_main, args=(r, store, cfg, turns, out))
        for r in (0, 1)
    ]
    for p in ranks:
        p.start()
    tokenizer = ZmqPushQueue(cfg.zmq_backend_addr, create=False, encoder=BaseBackendMsg.encoder)
    seen: Dict[int, Dict[int, List[int]]] = {0: {}, 1: {}}

    def reports_until(turn: int) -> None:
        while min(max(seen[r], default=-2) for r in seen) < turn:
            rank, at, uids = out.get(timeout=120)
            seen[rank][at] = uids

    try:
        with stopped_on_exit(*ranks):
            reports_until(-1)  # both ranks are in
            for uid in range(3):  # turn 0 wakes on uid 0; 1 and 2 come in turn 0 or 1
                tokenizer.put(AbortBackendMsg(uid))
            reports_until(1)
            tokenizer.socket.send(b"\x93garbage")  # dropped by rank 0, never forwarded
            tokenizer.put(AbortBackendMsg(3))  # wakes turn 2
            tokenizer.put(AbortBackendMsg(4))  # turn 2 or 3 takes it, or else turn 4
            reports_until(3)
            taken = [uid for turn in range(4) for uid in seen[0][turn]]
            if 4 in taken:  # else uid 4 is still on its way, and it wakes turn 4 itself
                tokenizer.put(AbortBackendMsg(5))  # so that turn 4 wakes
            reports_until(4)
            finish(ranks)
    finally:
        tokenizer.stop()
    assert seen[0] == seen[1], seen  # the same messages, at the same turns
    expected = [0, 1, 2, 3, 4, *([5] if 4 in taken else [])]
    assert [uid for turn in range(5) for uid in seen[0][turn]] == expected


def test_rank0_says_so_when_a_rank_never_comes() -> None:
    cfg = config(tp_info=DistributedInfo(0, 2), distributed_timeout=0.5)
    io = Ranks(cfg, tp_cpu_group=object())  # never reached: the wait times out first
    try:
        with pytest.raises(
            TimeoutError, match=r"0 of 1 subscribers joined .*broadcast within 0.5 s"
        ):
            io.sync_all_ranks()
    finally:
        io.stop_io()


def test_rank0_fails_at_once_when_a_rank_has_left() -> None:
    cfg = config(tp_info=DistributedInfo(0, 2), distributed_timeout=30.0)
    io = Ranks(cfg, tp_cpu_group=object())  # never reached: the forward fails first
    publisher = io._send_into_ranks
    rank1 = ZmqSubQueue(cfg.zmq_scheduler_broadcast_addr, create=False, decoder=lambda d: d)
    requests = ZmqPushQueue(cfg.zmq_backend_addr, create=False, encoder=BaseBackendMsg.encoder)
    try:
        publisher.wait_for_subscribers(timeout=10)  # rank 1 is in
        rank1.stop()  # and leaves, as a killed rank does
        deadline = time.monotonic() + 10
        while publisher.subscribed and time.monotonic() < deadline:  # until rank 0 has seen it
            publisher.socket.poll(50)
            with contextlib.suppress(TimeoutError):
                publisher.wait_for_subscribers(timeout=0)
        requests.put(ExitMsg())
        began = time.monotonic()
        with pytest.raises(RuntimeError, match=r"another rank has stopped \(0 of 1 subscribers"):
            io.receive_msg(blocking=True)
        assert time.monotonic() - began < 1.0
    finally:
        requests.stop()
        io.stop_io()


def test_rank0_looks_at_its_subscribers_once_in_the_same_call_as_the_send() -> None:
    """A departure reported just after rank 0 has looked must not make the send wait again, for
    the whole timeout: looking and sending in two calls once cost chapter 16's dead-rank test
    20 s. Here the fake publisher reports the departure right after the first look."""
    looks: List[float | None] = []
    sent: List[bytes] = []

    class Publisher:
        subscribed = 1

        def wait_for_subscribers(self, timeout: float | None = None) -> None:
            looks.append(timeout)
            if self.subscribed < 1:
                raise TimeoutError("0 of 1 subscribers joined")
            self.subscribed = 0  # rank 1 is reported gone just after this look

        def put_raw(self, raw: bytes, timeout: float | None = None) -> None:
            self.wait_for_subscribers(timeout)
            sent.append(raw)

    rank0 = Ranks.__new__(Ranks)
    rank0._send_into_ranks = Publisher()  # type: ignore[assignment]
    rank0._forward_to_ranks(b"message")
    assert looks == [0] and sent == [b"message"]  # one look, no wait, then the send
    with pytest.raises(RuntimeError, match="another rank has stopped"):
        rank0._forward_to_ranks(b"next")  # the departure counts at the next message
    assert looks == [0, 0] and sent == [b"message"]


def test_offline_mode_opens_no_socket() -> None:
    io = Ranks(config(offline_mode=True), tp_cpu_group=None)
    assert io.receive_msg == io.offline_receive_msg and io._queues == []
    with pytest.raises(NotImplementedError):
        io.receive_msg()


def test_the_addresses_are_unix_sockets_in_the_temporary_folder() -> None:
    assert config().zmq_backend_addr.startswith(f"ipc://{tempfile.gettempdir()}/minisgl-")
