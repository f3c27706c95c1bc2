"""Typed message queues between processes, over ZMQ sockets.

Each queue wraps one socket and one direction: `put` encodes a message to a dict (the
message classes' `encoder`), packs it with msgpack and sends it; `get` does the reverse.
`create=True` binds the address (the side that lives longest), `create=False` connects to it.

    PUSH -> PULL   many producers, one consumer (API server -> tokenizer -> scheduler -> ...)
    PUB  -> SUB    one producer, every consumer gets every message (scheduler rank 0 -> ranks)

The publisher here waits for its subscribers before it sends anything: a PUB socket drops
what it sends while no subscription has reached it, and a subscriber's `connect` returns
before its subscription has travelled (see `ZmqPubQueue`).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Generic, TypeVar

import msgpack
import zmq
import zmq.asyncio

T = TypeVar("T")

LINGER_MS = 1000  # how long closing a socket may wait to flush what it still holds


def _open(
    context: zmq.Context, kind: int, addr: str, create: bool, options: Dict[int, int | bytes] = {}
) -> zmq.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, LINGER_MS)  # so stop() cannot hang on a peer that is gone
    for option, value in options.items():  # before bind or connect, so they hold from the start
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


class _ZmqQueue:
    context: zmq.Context
    socket: zmq.Socket

    def stop(self) -> None:
        self.socket.close()
        self.context.term()


class ZmqPushQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, encoder: Callable[[T], Dict]) -> None:
        self.context = zmq.Context()
        self.socket = _open(self.context, zmq.PUSH, addr, create)
        self.encoder = encoder

    def put(self, obj: T) -> None:
        self.socket.send(_pack(self.encoder, obj), copy=False)


class ZmqAsyncPushQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, encoder: Callable[[T], Dict]) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = _open(self.context, zmq.PUSH, addr, create)
        self.encoder = encoder

    async def put(self, obj: T) -> None:
        await self.socket.send(_pack(self.encoder, obj), copy=False)


class ZmqPullQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, decoder: Callable[[Dict], T]) -> None:
        self.context = zmq.Context()
        self.socket = _open(self.context, zmq.PULL, addr, create)
        self.decoder = decoder

    def get(self) -> T:
        return self.decode(self.socket.recv())

    def get_raw(self) -> bytes:
        """The next message still packed: rank 0 forwards it to the other ranks as it is."""
        return self.socket.recv()

    def decode(self, raw: bytes) -> T:
        return _unpack(self.decoder, raw)

    def empty(self) -> bool:
        return self.socket.poll(timeout=0) == 0


class ZmqAsyncPullQueue(_ZmqQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, decoder: Callable[[Dict], T]) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = _open(self.context, zmq.PULL, addr, create)
        self.decoder = decoder

    async def get(self) -> T:
        return _unpack(self.decoder, await self.socket.recv())


class ZmqPubQueue(_ZmqQueue, Generic[T]):
    """One sender, `num_subscribers` receivers that each get every message.

    The socket is an XPUB: a PUB that also hands us each subscription as a one-frame message
    (b"\\x01" + topic; b"\\x00" + topic when one leaves). `wait_for_subscribers` reads them
    until all expected subscribers are in; `put` calls it first, so no message is ever sent
    into a socket that would drop it for want of a subscriber.
    """

    def __init__(
        self,
        addr: str,
        create: bool,
        encoder: Callable[[T], Dict],
        num_subscribers: int = 0,
    ) -> None:
        self.context = zmq.Context()
        # XPUB_VERBOSER: report every subscription and every departure, not only the first
        # subscriber and the last leaver of each topic
        self.socket = _open(self.context, zmq.XPUB, addr, create, {zmq.XPUB_VERBOSER: 1})
        self.addr = addr
        self.encoder = encoder
        self.num_subscribers = num_subscribers
        self.subscribed = 0

    def wait_for_subscribers(self, timeout: float | None = None) -> None:
        """Block until `num_subscribers` subscriptions have arrived (TimeoutError if not)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.subscribed < self.num_subscribers:
            wait_ms = None if deadline is None else max(0, int(1000 * (deadline - time.monotonic())))
            if self.socket.poll(timeout=wait_ms) == 0:
                raise TimeoutError(
                    f"{self.subscribed} of {self.num_subscribers} subscribers joined "
                    f"{self.addr} within {timeout} s"
                )
            event = self.socket.recv()
            self.subscribed += 1 if event[:1] == b"\x01" else -1

    def put_raw(self, raw: bytes) -> None:
        self.wait_for_subscribers()
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
        self.decoder = decoder

    def get(self) -> T:
        return _unpack(self.decoder, self.socket.recv())

    def empty(self) -> bool:
        return self.socket.poll(timeout=0) == 0
