"""The life of one request across the processes (the architecture page, chapters 12-15),
recorded from a real run.

A real tokenizer worker and a real scheduler run as processes of their own, as the server
starts them. The recorder plays the API server, and it also sits on the two wires between
the worker and the scheduler: every message the two send each other goes through it, is
recorded, and is passed on unchanged. So each frame is one real message on its real wire.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
from typing import List, Optional, Tuple

from tools.animations import Animation
from tools.figures.svg import AMBER, BLUE, GREEN, ORANGE, TEAL, Svg

NAME = "request-life"
SOURCES = [
    "tools/animations/request_life.py",
    "minisgl/tokenizer/server.py",
    "minisgl/scheduler/io.py",
    "minisgl/message/tokenizer.py",
    "minisgl/message/backend.py",
    "minisgl/message/frontend.py",
]
QUESTION = "What is the capital of France?"
MAX_TOKENS = 6
TIMEOUT_S = 120.0
WIDTH, HEIGHT = 940, 330
# where each process sits; the wires run between them (y of the request and reply lanes)
BOXES = {
    "api": (20, "API server", BLUE),
    "worker": (350, "tokenizer worker", TEAL),
    "scheduler": (680, "scheduler", ORANGE),
}
BOX_W, BOX_TOP, BOX_H = 240, 60, 150
LANE_TO, LANE_BACK = 105, 170


def _started(queue, process, what: str) -> None:
    """Wait (bounded) for a child's "ready" on a multiprocessing queue, while it is alive."""
    import queue as queues
    import time

    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            queue.get(timeout=0.5)
            return
        except queues.Empty:
            if not process.is_alive():
                raise RuntimeError(
                    f"{what} exited with code {process.exitcode} before it was ready"
                ) from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} was not ready within {TIMEOUT_S} s") from None


def draw(
    pids: dict, wire: Optional[Tuple[str, str]], label: str, answer: str, tokens: List[int]
) -> str:
    """The three processes; the wire `wire` = (from, to) carries a message described by
    `label`; under them, what the API server has shown so far and the tokens sampled."""
    s = Svg("anim-request-life", WIDTH, HEIGHT, "The life of a request", label)
    for key, (x, title, colour) in BOXES.items():
        s.box(x, BOX_TOP, BOX_W, BOX_H, colour, rx=10, fill_opacity=0.14)
        s.text(x + 12, BOX_TOP + 24, title, size=15, bold=True)
        s.text(x + 12, BOX_TOP + 44, pids.get(key, ""), size=12, muted=True)
    for (a, b), y in (
        (("api", "worker"), LANE_TO),
        (("worker", "scheduler"), LANE_TO),
        (("scheduler", "worker"), LANE_BACK),
        (("worker", "api"), LANE_BACK),
    ):
        xa, xb = BOXES[a][0], BOXES[b][0]
        x1, x2 = (xa + BOX_W, xb) if xa < xb else (xa, xb + BOX_W)
        active = wire == (a, b)
        s.arrow(
            x1 + 4,
            y,
            x2 - 4,
            y,
            color=AMBER if active else None,
            width=3 if active else 1,
            opacity=1 if active else 0.35,
        )
    if wire is not None:
        s.text(20, 30, label, size=14, bold=True)
        a, b = wire
        xa, xb = BOXES[a][0], BOXES[b][0]
        mid = (min(xa, xb) + BOX_W + max(xa, xb)) / 2
        y = LANE_TO if xa < xb else LANE_BACK
        s.label_bg(mid, y - 10, label.split("(")[0], size=12, bold=True)
    s.text(20, HEIGHT - 70, "shown to the client so far:", size=12, muted=True)
    s.text(200, HEIGHT - 70, repr(answer)[:80], size=13, mono=True, color=GREEN)
    s.text(20, HEIGHT - 44, "tokens the scheduler sampled:", size=12, muted=True)
    s.text(200, HEIGHT - 44, str(tokens)[:80], size=13, mono=True)
    s.text(
        20,
        HEIGHT - 16,
        "request lane above, reply lane below; the highlighted wire carries this frame's message",
        size=12,
        muted=True,
    )
    return s.render()


def record() -> Animation:
    import torch

    from examples.helpers.scheduler_process import run_scheduler
    from minisgl.core import SamplingParams
    from minisgl.distributed import DistributedInfo
    from minisgl.message import (
        BaseBackendMsg,
        BaseFrontendMsg,
        BaseTokenizerMsg,
        BatchBackendMsg,
        BatchFrontendMsg,
        BatchTokenizerMsg,
        ExitMsg,
        TokenizeMsg,
        UserMsg,
    )
    from minisgl.scheduler import SchedulerConfig
    from minisgl.tokenizer.server import tokenize_worker
    from minisgl.utils import ZmqPullQueue, ZmqPushQueue
    from tools.models import SMOLLM2, ensure_model
    from tools.parity import load_tokenizer
    from tools.processes import finish, receive, stopped_on_exit

    path = str(ensure_model(SMOLLM2))
    tok = load_tokenizer(SMOLLM2)
    config = SchedulerConfig(
        model_path=path,
        tp_info=DistributedInfo(0, 1),
        dtype=torch.float32,
        max_running_req=4,
        page_size=1,
        num_page_override=256,
    )
    # the Unix sockets' files live in a folder of their own, deleted at the end with whatever
    # zmq or a killed worker left there
    sockets = tempfile.TemporaryDirectory(prefix="book-animation-")
    worker_addr, tap_backend, front = (
        f"ipc://{sockets.name}/{name}" for name in ("worker", "tap-backend", "frontend")
    )
    # the recorder's sockets: it binds what the worker connects to, connects to the rest
    from_worker = ZmqPullQueue(tap_backend, create=True, decoder=BaseBackendMsg.decoder)
    replies = ZmqPullQueue(front, create=True, decoder=BaseFrontendMsg.decoder)
    ctx = mp.get_context("spawn")
    ready: mp.Queue = ctx.Queue()
    scheduler = ctx.Process(target=run_scheduler, args=(config, ready), name="scheduler")
    acks: mp.Queue = ctx.Queue()
    worker = ctx.Process(
        target=tokenize_worker,
        name="tokenizer worker",
        kwargs=dict(
            tokenizer_path=path,
            addr=worker_addr,
            create=True,
            backend_addr=tap_backend,
            frontend_addr=front,
            local_bs=1,
            tokenizer_id=0,
            ack_queue=acks,
        ),
    )
    animation = Animation(NAME, "The life of a request across the processes", [], 3.5)
    answer, tokens = "", []
    with sockets, stopped_on_exit(scheduler, worker):
        scheduler.start()
        worker.start()
        _started(ready, scheduler, "the scheduler")
        _started(acks, worker, "the tokenizer worker")
        to_scheduler = ZmqPushQueue(
            config.zmq_backend_addr, create=False, encoder=BaseBackendMsg.encoder
        )
        from_scheduler = ZmqPullQueue(
            config.zmq_detokenizer_addr, create=False, decoder=BaseTokenizerMsg.decoder
        )
        to_worker = ZmqPushQueue(worker_addr, create=False, encoder=BaseTokenizerMsg.encoder)
        pids = {
            "api": f"this recorder, pid {os.getpid()}",
            "worker": f"pid {worker.pid}",
            "scheduler": f"pid {scheduler.pid}",
        }

        def frame(wire, label: str, narration: str) -> None:
            animation.add(draw(pids, wire, label, answer, list(tokens)), narration)

        def unbatch(msg, batch_type) -> list:
            return list(msg.data) if isinstance(msg, batch_type) else [msg]

        frame(
            None,
            "",
            "Three processes, each with its own Python interpreter: the API server "
            "(here, the recorder), the tokenizer worker and the scheduler, which owns the "
            "model. They talk only through ZMQ sockets.",
        )
        chat = [{"role": "user", "content": QUESTION}]
        to_worker.put(
            TokenizeMsg(uid=0, text=chat, sampling_params=SamplingParams(max_tokens=MAX_TOKENS))
        )
        frame(
            ("api", "worker"),
            "TokenizeMsg(uid=0, text=[1 chat message])",
            f"A client asks {QUESTION!r}. The API server gives the request uid 0 and pushes a "
            f"TokenizeMsg with the chat messages and max_tokens={MAX_TOKENS} to the worker.",
        )
        count = unbatch(receive(replies, [worker], TIMEOUT_S, "the count"), BatchFrontendMsg)[0]
        frame(
            ("worker", "api"),
            f"UserReply(uid=0, prompt_tokens={count.prompt_tokens})",
            f"The worker applies the chat template and tokenizes: {count.prompt_tokens} "
            f"tokens. It tells the API server the count first, so that a prompt too long for "
            f"the model could still be refused before any answer.",
        )
        user = unbatch(receive(from_worker, [worker], TIMEOUT_S, "the prompt"), BatchBackendMsg)
        msg = user[0]
        assert isinstance(msg, UserMsg)
        to_scheduler.put(user[0] if len(user) == 1 else BatchBackendMsg(data=user))
        frame(
            ("worker", "scheduler"),
            f"UserMsg(uid=0, input_ids=[{len(msg.input_ids)} ids])",
            f"Then it pushes a UserMsg with the {len(msg.input_ids)} token ids to the "
            f"scheduler, which queues the request, admits it and computes its prefill.",
        )
        finished = False
        while not finished:
            got = receive(from_scheduler, [scheduler], TIMEOUT_S, "a token")
            for step in unbatch(got, BatchTokenizerMsg):
                tokens.append(step.next_token)
                frame(
                    ("scheduler", "worker"),
                    f"DetokenizeMsg(uid=0, next_token={step.next_token}, finished={step.finished})",
                    f"The scheduler samples token {step.next_token} "
                    f"({tok.decode([step.next_token])!r}) and pushes it to the worker"
                    + (", flagged as the last one." if step.finished else "."),
                )
                to_worker.put(step)
                reply = unbatch(receive(replies, [worker], TIMEOUT_S, "a reply"), BatchFrontendMsg)[
                    0
                ]
                answer += reply.incremental_output
                finished = reply.finished
                text = reply.incremental_output
                why = f", finish_reason={reply.finish_reason!r}" if reply.finished else ""
                frame(
                    ("worker", "api"),
                    f"UserReply(uid=0, {text!r}{why})",
                    f"The worker detokenizes incrementally and sends the new text {text!r}; "
                    f"the API server streams it to the client at once"
                    + (
                        f". The request is done ({reply.finish_reason})." if reply.finished else "."
                    ),
                )
        frame(
            None,
            "",
            f"The client received {answer!r}: {len(tokens)} tokens, each sent by the "
            f"scheduler to the worker as a token id, and by the worker to the API server as "
            f"text.",
        )
        to_scheduler.put(ExitMsg())
        finish([scheduler])
        worker.terminate()
        worker.join(30)
        for q in (to_scheduler, from_scheduler, to_worker, from_worker, replies):
            q.stop()
    return animation
