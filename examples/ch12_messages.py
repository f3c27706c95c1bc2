"""Chapter 12: messages and ZMQ queues.

Every message type is packed to bytes and unpacked again. Then the scheduler runs in a process
of its own: this process plays the tokenizer, sends it the requests over a PUSH socket and
reads its tokens from a PULL socket, and the tokens must match transformers. Last, the
broadcast from scheduler rank 0 to the other ranks: a plain PUB socket drops what it sends
before a subscription has reached it; ours waits for its subscribers.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Dict, List

import msgpack
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from examples.helpers.socket_scheduler import serve  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.message import (  # noqa: E402
    AbortBackendMsg,
    AbortMsg,
    BaseBackendMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    TokenizeMsg,
    UserMsg,
    UserReply,
)
from minisgl.utils import (  # noqa: E402
    ZmqPubQueue,
    ZmqPullQueue,
    ZmqPushQueue,
    ZmqSubQueue,
    worker_context,
)
from tools.models import ensure_model  # noqa: E402
from tools.parity import book_dtype, run_parity  # noqa: E402
from tools.processes import finish, receive, stopped_on_exit  # noqa: E402

REPLY_TIMEOUT_S = 120  # a scheduler that sends nothing for this long is stuck


def show_the_wire() -> None:
    """One message of each type: its size once packed, and whether it comes back equal."""
    # a 1000-token prompt with ids from a vocabulary of 151936 (Qwen's)
    prompt = torch.randint(
        0, 151936, (1000,), dtype=torch.int32, generator=torch.Generator().manual_seed(0)
    )
    samples = [
        (
            BaseTokenizerMsg,
            TokenizeMsg(7, "The capital of France is", SamplingParams(max_tokens=16)),
        ),
        (BaseTokenizerMsg, TokenizeMsg(8, [{"role": "user", "content": "Hi!"}], SamplingParams())),
        (BaseBackendMsg, UserMsg(7, prompt, SamplingParams(temperature=0.7, top_p=0.9))),
        (BaseBackendMsg, BatchBackendMsg([AbortBackendMsg(3), ExitMsg()])),
        (
            BaseTokenizerMsg,
            BatchTokenizerMsg([DetokenizeMsg(7, 4911, False), DetokenizeMsg(8, 2, True)]),
        ),
        (BaseTokenizerMsg, AbortMsg(7)),
        (BaseFrontendMsg, UserReply(7, " Paris", finished=False)),
    ]
    print(f"{'message':18s} {'bytes':>6s}  round trip")
    for family, msg in samples:
        raw = msgpack.packb(family.encoder(msg), use_bin_type=True)
        back = family.decoder(msgpack.unpackb(raw, raw=False))
        same = (
            back == msg
            if not isinstance(msg, UserMsg)
            else torch.equal(back.input_ids, msg.input_ids)
        )
        print(f"{type(msg).__name__:18s} {len(raw):6d}  {'equal' if same else 'DIFFERENT'}")
    as_list = len(msgpack.packb(prompt.tolist()))
    print(
        f"the 1000-token prompt: {prompt.numel() * prompt.element_size()} bytes as raw int32 "
        f"memory, {as_list} as a msgpack list of integers"
    )
    raw_us, list_us = (
        1e6 * timeit.timeit(fn, number=200) / 200
        for fn in (
            lambda: wire_copy(prompt.numpy().tobytes()),
            lambda: torch.tensor(
                msgpack.unpackb(msgpack.packb(prompt.tolist())), dtype=torch.int32
            ),
        )
    )
    print(
        f"packing and unpacking it: {raw_us:6.1f} us as raw memory, {list_us:6.1f} us as a list\n"
    )


def wire_copy(raw: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(msgpack.unpackb(msgpack.packb(raw))), dtype=torch.int32)


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    with tempfile.TemporaryDirectory(prefix="minisgl-ch12-") as folder:
        return generate_over(f"ipc://{folder}", name, prompts, n)


def generate_over(folder: str, name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    backend_addr, detokenizer_addr = f"{folder}/backend", f"{folder}/detokenizer"
    replies = ZmqPullQueue(detokenizer_addr, create=True, decoder=BaseTokenizerMsg.decoder)
    requests = ZmqPushQueue(backend_addr, create=False, encoder=BaseBackendMsg.encoder)
    dtype = str(book_dtype()).removeprefix("torch.")
    scheduler = worker_context().Process(
        target=serve, args=(str(ensure_model(name)), dtype, backend_addr, detokenizer_addr)
    )
    scheduler.start()
    outputs: Dict[int, List[int]] = {uid: [] for uid in range(len(prompts))}
    try:
        with stopped_on_exit(scheduler):  # whatever happens here, the scheduler is gone after
            # sent before the scheduler has bound its socket: a PUSH socket keeps it until it has
            requests.put(
                BatchBackendMsg(
                    [
                        UserMsg(
                            uid, torch.tensor(p, dtype=torch.int32), SamplingParams(max_tokens=n)
                        )
                        for uid, p in enumerate(prompts)
                    ]
                )
            )
            running = set(outputs)
            while running:
                reply = receive(replies, [scheduler], REPLY_TIMEOUT_S, "the scheduler's tokens")
                for msg in reply.data if isinstance(reply, BatchTokenizerMsg) else [reply]:
                    outputs[msg.uid].append(msg.next_token)
                    if msg.finished:
                        running.discard(msg.uid)
            requests.put(ExitMsg())
            finish([scheduler])  # it exits with code 0 within 30 s, or this raises
    finally:
        requests.stop()
        replies.stop()
    return [outputs[uid] for uid in range(len(prompts))]


# ------------------------------------------------------------------------------ the broadcast
def late_subscriber(addr: str, delay: float, received: List[int]) -> None:
    time.sleep(delay)  # a rank that starts a little later than rank 0
    queue = ZmqSubQueue(addr, create=False, decoder=BaseBackendMsg.decoder)
    while queue.socket.poll(timeout=500):
        received.append(queue.get().uid)
    queue.stop()


def broadcast(folder: str, num_subscribers: int) -> List[List[int]]:
    addr = f"{folder}/broadcast{num_subscribers}"
    publisher = ZmqPubQueue(
        addr, create=True, encoder=BaseBackendMsg.encoder, num_subscribers=num_subscribers
    )
    received: List[List[int]] = [[], []]
    ranks = [threading.Thread(target=late_subscriber, args=(addr, 0.2, r)) for r in received]
    for rank in ranks:
        rank.start()
    try:
        publisher.wait_for_subscribers(timeout=30)  # put() would wait too, but without a bound
        for uid in range(5):
            publisher.put(AbortBackendMsg(uid))
    finally:
        for rank in ranks:
            rank.join()
        publisher.stop()
    return received


def connect_then_send(folder: str, trials: int) -> int:
    """How often a message sent right after a subscriber's connect() returned is lost."""
    lost = 0
    for i in range(trials):
        addr = f"{folder}/race{i}"
        publisher = ZmqPubQueue(addr, create=True, encoder=BaseBackendMsg.encoder)  # waits for none
        subscriber = ZmqSubQueue(addr, create=False, decoder=BaseBackendMsg.decoder)
        publisher.put(AbortBackendMsg(i))
        lost += subscriber.socket.poll(timeout=100) == 0
        subscriber.stop()
        publisher.stop()
    return lost


def show_the_broadcast() -> None:
    print("rank 0 publishes 5 messages; ranks 1 and 2 subscribe 0.2 s later")
    with tempfile.TemporaryDirectory(prefix="minisgl-ch12-") as folder:
        for n, label in ((0, "a plain PUB (upstream)"), (2, "waiting for 2 subscribers")):
            received = broadcast(f"ipc://{folder}", n)
            print(
                f"  {label:26s}: rank 1 got {len(received[0])} of 5, rank 2 got "
                f"{len(received[1])} of 5"
            )
        lost = connect_then_send(f"ipc://{folder}", 10)
    print(
        f"  a plain PUB, sending right after the subscriber's connect() returned: lost {lost:2d} "
        "of 10\n"
    )


def main() -> int:
    show_the_wire()
    show_the_broadcast()
    print("the scheduler in its own process, requests and tokens over ZMQ:")
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
