"""Chapter 13: the tokenizer worker and incremental detokenisation.

First, a text streamed back one token at a time: what decoding each token alone gives, and
what the detokenizer sends. Then the pipeline of chapter 12 gains its tokenizer: this process
sends text, a tokenizer worker turns it into ids for the scheduler (in a process of its own),
and turns the scheduler's tokens back into pieces of text. The tokens must match
transformers, and the streamed text must equal the decoded tokens.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from examples.helpers.socket_scheduler import serve  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.message import (  # noqa: E402
    BaseBackendMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    TokenizeMsg,
)
from minisgl.tokenizer import tokenize_worker  # noqa: E402
from minisgl.tokenizer.detokenize import DetokenizeManager  # noqa: E402
from minisgl.utils import ZmqPullQueue, ZmqPushQueue, worker_context  # noqa: E402
from tools.models import DEMO_MODEL, ensure_model  # noqa: E402
from tools.parity import DEFAULT_TEXTS, book_dtype, load_tokenizer, run_parity  # noqa: E402
from tools.processes import finish, receive, stopped_on_exit  # noqa: E402

REPLY_TIMEOUT_S = 120  # a worker that sends nothing for this long is stuck

STREAMED: Dict[str, List[bool]] = {}  # per model: did each request's text equal its tokens?


def show_streaming() -> None:
    tok = load_tokenizer(DEMO_MODEL)
    text = "Café ☕ in 東京 🚀!"
    ids = tok.encode(text)
    manager = DetokenizeManager(tok)
    print(f"{text!r} is {len(ids)} tokens; streamed one at a time:")
    print(f"  {'token':>6s}  {'decoded alone':16s}  sent")
    sent = []
    for i, token in enumerate(ids):
        piece = manager.detokenize([DetokenizeMsg(0, token, i == len(ids) - 1)])[0]
        sent.append(piece)
        print(f"  {token:6d}  {tok.decode([token])!r:16s}  {piece!r}")
    print(f"  joined: {''.join(sent)!r}, equal to the text: {''.join(sent) == text}\n")


def unwrap(msg) -> List:
    return msg.data if isinstance(msg, (BatchFrontendMsg, BatchTokenizerMsg)) else [msg]


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    with tempfile.TemporaryDirectory(prefix="minisgl-ch13-") as folder:
        return generate_over(f"ipc://{folder}", name, prompts, n)


def generate_over(folder: str, name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    """This process is the API server: it sends text and reads text. It also sits between the
    scheduler and the detokenizer, to record the tokens that pass."""
    addr = {k: f"{folder}/{k}" for k in ("tokenizer", "backend", "tap", "frontend")}
    frontend = ZmqPullQueue(addr["frontend"], create=True, decoder=BaseFrontendMsg.decoder)
    tap = ZmqPullQueue(addr["tap"], create=True, decoder=BaseTokenizerMsg.decoder)
    to_tokenizer = ZmqPushQueue(addr["tokenizer"], create=False, encoder=BaseTokenizerMsg.encoder)
    to_scheduler = ZmqPushQueue(addr["backend"], create=False, encoder=BaseBackendMsg.encoder)
    workers = worker_context()
    dtype = str(book_dtype()).removeprefix("torch.")
    model = str(ensure_model(name))
    scheduler = workers.Process(target=serve, args=(model, dtype, addr["backend"], addr["tap"]))
    worker = workers.Process(
        target=tokenize_worker,
        kwargs=dict(
            tokenizer_path=model,
            addr=addr["tokenizer"],
            create=True,
            backend_addr=addr["backend"],
            frontend_addr=addr["frontend"],
            local_bs=8,
        ),
    )
    scheduler.start()
    worker.start()
    workers = [scheduler, worker]

    # the prompts of run_parity, as text: the last one as a chat
    texts: List[str | List[Dict[str, str]]] = [
        *DEFAULT_TEXTS[:-1],
        [{"role": "user", "content": DEFAULT_TEXTS[-1]}],
    ]
    assert len(texts) == len(prompts)
    tokens: Dict[int, List[int]] = {uid: [] for uid in range(len(texts))}
    streamed: Dict[int, str] = {uid: "" for uid in range(len(texts))}
    try:
        with stopped_on_exit(*workers):  # whatever happens here, both are gone after
            for uid, text in enumerate(texts):
                to_tokenizer.put(TokenizeMsg(uid, text, SamplingParams(max_tokens=n)))
            running, streaming = set(tokens), set(tokens)
            while running:
                reply = receive(tap, workers, REPLY_TIMEOUT_S, "the scheduler's tokens")
                for msg in unwrap(reply):
                    tokens[msg.uid].append(msg.next_token)
                    running.discard(msg.uid) if msg.finished else None
                to_tokenizer.put(reply)  # on to the detokenizer, as it came
            while streaming:
                for msg in unwrap(receive(frontend, workers, REPLY_TIMEOUT_S, "the streamed text")):
                    streamed[msg.uid] += msg.incremental_output
                    streaming.discard(msg.uid) if msg.finished else None
            to_scheduler.put(ExitMsg())
            worker.terminate()  # SIGTERM: the worker leaves its loop (make_stoppable)
            finish(workers)  # both exit with code 0 within 30 s, or this raises
    finally:
        for queue in (frontend, tap, to_tokenizer, to_scheduler):
            queue.stop()
    tok = load_tokenizer(name)
    eos = tok.eos_token_id
    STREAMED[name] = [
        streamed[uid] == tok.decode([t for t in tokens[uid] if t != eos]) for uid in tokens
    ]
    return [tokens[uid] for uid in range(len(texts))]


def main() -> int:
    show_streaming()
    print("text in, text out: a tokenizer worker and a scheduler, each in its own process")
    summary = run_parity(generate)
    equal = sum(sum(v) for v in STREAMED.values())
    total = sum(len(v) for v in STREAMED.values())
    print(f"streamed text equal to the decoded tokens: {equal} of {total} requests")
    return 0 if summary.ok and equal == total else 1


if __name__ == "__main__":
    sys.exit(main())
