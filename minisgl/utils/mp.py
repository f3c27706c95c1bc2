"""Typed message queues between processes, over ZMQ sockets, and how a worker process ends.

Each queue wraps one socket and one direction: `put` encodes a message to a dict (the
message classes' `encoder`), packs it with msgpack and sends it; `get` does the reverse.
`create=True` binds the address (the side that lives longest), `create=False` connects to it.

    PUSH -> PULL   many producers, one consumer (API server -> tokenizer -> scheduler -> ...)
    PUB  -> SUB    one producer, every consumer gets every message (scheduler rank 0 -> ranks)

The publisher here waits for its subscribers before it sends anything: a PUB socket drops
what it sends while no subscription has reached it, and a subscriber's `connect` returns
before its subscription has travelled (see `ZmqPubQueue`).

A blocking `get` waits in slices of `WAIT_SLICE_MS`, never in one long call into ZMQ: Python
runs a signal handler only between two bytecodes, so a process parked inside `recv` would not
notice SIGINT or SIGTERM until a message came. `get(timeout=...)` raises `TimeoutError`.

Worker processes come from `worker_context()`: a fork server that imports the workers'
modules once, so that each worker starts in milliseconds instead of importing torch again.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import threading
import time
from multiprocessing.context import BaseContext
from pathlib import Path
from types import FrameType
from typing import Callable, Dict, Generic, Sequence, TypeVar

import msgpack
import zmq
import zmq.asyncio

T = TypeVar("T")

LINGER_MS = 1000  # how long closing a socket may wait to flush what it still holds
# what a worker imports: the scheduler (torch, the engine) and the tokenizer (transformers); a
# module this chapter's tree does not have yet is skipped
WORKER_MODULES = ("minisgl.scheduler", "minisgl.tokenizer")
# what every fork server imports besides, whatever its workers: each of them reads a model's
# config or tokenizer, and transformers imports the modules behind AutoConfig and AutoTokenizer
# only at their first use (1 to 2 s of every worker's start otherwise)
HF_MODULES = (
    "transformers.models.auto.configuration_auto",
    "transformers.models.auto.tokenization_auto",
)
WAIT_SLICE_MS = 100  # a blocking get() looks up from the socket this often


def _open(
    context: zmq.Context,
    kind: int,
    addr: str,
    create: bool,
    options: Dict[int, int | bytes] | None = None,
) -> zmq.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, LINGER_MS)  # so stop() cannot hang on a peer that is gone
    for option, value in (
        options or {}
    ).items():  # before bind or connect: they hold from the start
        socket.setsockopt(option, value)
    if create:
        socket.bind(addr)
    else:
        socket.connect(addr)
    return socket


def _pack(encoder: Callable[[T], Dict], obj: T) -> bytes:
    return msgpack.packb(encoder(obj), use_bin_type=True)


def _unpack(decoder: Callable[[Dict], T], raw: bytes) -> T:
    return decoder(msgpack.unpackb(raw, raw=False))


def _receive(socket: zmq.Socket, addr: str, timeout: float | None) -> bytes:
    """The next message on `socket`, waiting in short slices (see the module docstring)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not socket.poll(timeout=WAIT_SLICE_MS):
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no message arrived on {addr} within {timeout} s")
    return socket.recv()


class _ZmqQueue:
    context: zmq.Context
    socket: zmq.Socket
    addr: str
    create: bool  # this side bound the address

    def stop(self) -> None:
        self.socket.close()
        self.context.term()
        if self.create and self.addr.startswith("ipc://") and not self.addr.startswith("ipc://@"):
            # libzmq leaves a bound ipc socket's file behind; the side that bound removes it
            Path(self.addr[len("ipc://") :]).unlink(missing_ok=True)


class ZmqPushQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, encoder: Callable[[T], Dict]) -> None:
        self.context = zmq.Context()
        self.socket = _open(self.context, zmq.PUSH, addr, create)
        self.addr, self.create = addr, create
        self.encoder = encoder

    def put(self, obj: T) -> None:
        self.socket.send(_pack(self.encoder, obj), copy=False)


class ZmqAsyncPushQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, encoder: Callable[[T], Dict]) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = _open(self.context, zmq.PUSH, addr, create)
        self.addr, self.create = addr, create
        self.encoder = encoder

    async def put(self, obj: T) -> None:
        await self.socket.send(_pack(self.encoder, obj), copy=False)


class ZmqPullQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, decoder: Callable[[Dict], T]) -> None:
        self.context = zmq.Context()
        self.socket = _open(self.context, zmq.PULL, addr, create)
        self.addr, self.create = addr, create
        self.decoder = decoder

    def get(self, timeout: float | None = None) -> T:
        return self.decode(self.get_raw(timeout))

    def get_raw(self, timeout: float | None = None) -> bytes:
        """The next message still packed: rank 0 forwards it to the other ranks as it is."""
        return _receive(self.socket, self.addr, timeout)

    def decode(self, raw: bytes) -> T:
        return _unpack(self.decoder, raw)

    def empty(self) -> bool:
        return self.socket.poll(timeout=0) == 0


class ZmqAsyncPullQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, decoder: Callable[[Dict], T]) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = _open(self.context, zmq.PULL, addr, create)
        self.addr, self.create = addr, create
        self.decoder = decoder

    async def get(self) -> T:
        return _unpack(self.decoder, await self.socket.recv())


class ZmqPubQueue(_ZmqQueue, Generic[T]):
    """One sender, `num_subscribers` receivers that each get every message.

    The socket is an XPUB: a PUB that also hands us each subscription as a one-frame message
    (b"\\x01" + topic; b"\\x00" + topic when one leaves). Before every send, `put` reads the
    subscriptions and departures reported so far and, while fewer than `num_subscribers` are
    in, waits for them (a TimeoutError after `timeout` seconds names how many came). So a
    message reaches every subscriber whose subscription has reached the publisher, and after
    a subscriber has left, nothing is sent until it (or another) is back.

    What no publisher can see: a subscriber that has closed its socket but whose departure
    has not been reported yet still counts, and a message sent in that instant is lost for it.
    """

    def __init__(
        self,
        addr: str,
        create: bool,
        encoder: Callable[[T], Dict],
        num_subscribers: int = 0,
        timeout: float = 60.0,
    ) -> None:
        self.context = zmq.Context()
        # XPUB_VERBOSER: report every subscription and every departure, not only the first
        # subscriber and the last leaver of each topic
        self.socket = _open(self.context, zmq.XPUB, addr, create, {zmq.XPUB_VERBOSER: 1})
        self.addr, self.create = addr, create
        self.encoder = encoder
        self.num_subscribers = num_subscribers
        self.timeout = timeout
        self.subscribed = 0

    def wait_for_subscribers(self, timeout: float | None = None) -> None:
        """Take in every (un)subscription reported so far; then, while fewer than
        `num_subscribers` are in, wait for more (TimeoutError after `timeout` seconds, by
        default the queue's own)."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            while self.socket.poll(timeout=0):
                event = self.socket.recv()
                self.subscribed += 1 if event[:1] == b"\x01" else -1
            if self.subscribed >= self.num_subscribers:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self.subscribed} of {self.num_subscribers} subscribers joined "
                    f"{self.addr} within {timeout} s"
                )
            self.socket.poll(timeout=min(WAIT_SLICE_MS, max(1, int(1000 * left))))

    def put_raw(self, raw: bytes, timeout: float | None = None) -> None:
        """Send packed bytes once the subscribers are in (`timeout` as wait_for_subscribers's;
        0: look once, without waiting)."""
        self.wait_for_subscribers(timeout)
        self.socket.send(raw, copy=False)

    def put(self, obj: T) -> None:
        self.put_raw(_pack(self.encoder, obj))


class ZmqSubQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, decoder: Callable[[Dict], T]) -> None:
        self.context = zmq.Context()
        # subscribe to every message, whatever its first bytes; what a SUB socket sends is
        # only its (un)subscription, which is not worth waiting for when it closes
        options: Dict[int, int | bytes] = {zmq.SUBSCRIBE: b"", zmq.LINGER: 0}
        self.socket = _open(self.context, zmq.SUB, addr, create, options)
        self.addr, self.create = addr, create
        self.decoder = decoder

    def get(self, timeout: float | None = None) -> T:
        return _unpack(self.decoder, _receive(self.socket, self.addr, timeout))

    def empty(self) -> bool:
        return self.socket.poll(timeout=0) == 0


# ------------------------------------------------------------ how a worker process starts and ends
def worker_context(preload: Sequence[str] = WORKER_MODULES) -> BaseContext:
    """The multiprocessing context to start workers with: the `forkserver` method. Its server
    process is started with the first worker, imports `preload` once, and forks every worker
    from itself. Like `spawn` (upstream's choice) a worker inherits no sockets, threads or
    CUDA state from its parent, and its target and arguments are pickled; unlike `spawn`, it
    does not import torch and transformers again (3 to 6 s each on a laptop CPU).

    Name in `preload` the module of the worker's target: unpickling the target imports it.
    The fork server also imports `HF_MODULES`. The first call that starts a worker starts the
    fork server; later calls share it.

    One thing differs: a worker sees the environment variables of the moment the fork server
    started, not of the moment the worker did. Set them before the first worker starts."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*preload, *HF_MODULES])  # it skips a module it cannot import
    return ctx


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def make_stoppable(grace: float = 5.0) -> None:
    """Call first thing in a worker process's main thread. Afterwards SIGINT (Ctrl-C) and
    SIGTERM (`Process.terminate()`) raise KeyboardInterrupt there, so the worker leaves its
    loop and closes its sockets; and when the process that started this one dies, the worker
    stops the same way, and is ended outright if it is still alive `grace` seconds later.

    Setting the handlers matters: Python turns SIGINT into KeyboardInterrupt only if the
    process inherited SIGINT's default action, and a program started in the background by a
    non-interactive shell (a CI job, `cmd &` in a script) inherits SIGINT *ignored*, and so
    do all its children: a worker that counts on Ctrl-C would then never stop.
    """
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    parent = mp.parent_process()
    if parent is not None:
        watch = threading.Thread(target=_stop_after, args=(parent.sentinel, grace), daemon=True)
        watch.start()


def _stop_after(parent_sentinel: int, grace: float) -> None:
    multiprocessing.connection.wait([parent_sentinel])  # returns when the parent is gone
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)
    os._exit(70)  # the main thread did not finish in time
