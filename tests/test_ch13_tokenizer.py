"""Chapter 13: the tokenizer worker, and incremental detokenisation."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import tempfile
import time
from typing import Dict, Iterator, List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BaseBackendMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchBackendMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    TokenizeMsg,
    UserMsg,
)
from minisgl.tokenizer import tokenize_worker
from minisgl.tokenizer.detokenize import REPLACEMENT_CHAR, DetokenizeManager
from minisgl.tokenizer.tokenize import TokenizeManager
from minisgl.utils import ZmqPullQueue, ZmqPushQueue, worker_context
from tools.models import ensure_model
from tools.parity import DEFAULT_TEXTS, build_prompts, load_tokenizer
from tools.processes import finish, receive, stopped_on_exit

MODEL = "tiny-qwen3"  # the tiny models carry SmolLM2's real tokenizer and chat template
TEXTS = [
    "Café ☕ in 東京, then 🚀 to Zürich!",
    "naïve façade — 100 € 👍🏽",
    "def f(x):\n    return x ** 2\n",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(MODEL)


def stream(
    manager: DetokenizeManager, uid: int, ids: List[int], eos: int | None = None
) -> List[str]:
    """Feed one request's ids one message at a time, the last one flagged finished."""
    tokens = ids + ([eos] if eos is not None else [])
    return [
        manager.detokenize([DetokenizeMsg(uid, t, i == len(tokens) - 1)])[0]
        for i, t in enumerate(tokens)
    ]


def test_tokenize_gives_the_reference_prompts(tokenizer) -> None:
    manager = TokenizeManager(tokenizer)
    msgs = [TokenizeMsg(i, t, SamplingParams()) for i, t in enumerate(DEFAULT_TEXTS[:-1])]
    msgs.append(TokenizeMsg(9, [{"role": "user", "content": DEFAULT_TEXTS[-1]}], SamplingParams()))
    ids = manager.tokenize(msgs)
    assert all(t.dtype == torch.int32 and t.dim() == 1 for t in ids)
    assert [t.tolist() for t in ids] == build_prompts(MODEL)


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_join_to_the_decoded_text(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    pieces = stream(DetokenizeManager(tokenizer), 0, ids, eos=tokenizer.eos_token_id)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any(REPLACEMENT_CHAR in p for p in pieces)


def test_a_character_split_over_tokens_waits_for_its_last_byte(tokenizer) -> None:
    ids = tokenizer.encode("🚀")
    assert len(ids) > 1  # the byte-level tokenizer splits the four bytes
    assert tokenizer.decode(ids[:1]).endswith(REPLACEMENT_CHAR)  # what naive decoding shows
    pieces = stream(DetokenizeManager(tokenizer), 0, ids)
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🚀"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 49151), min_size=1, max_size=24))
def test_any_ids_stream_to_their_decoded_text(ids: List[int]) -> None:
    """Random ids, broken characters included: the pieces join to tokenizer.decode, and no
    piece but the last ends in the middle of a character."""
    tok = _TOKENIZER
    ids = [i for i in ids if i != tok.eos_token_id] or [5]
    pieces = stream(DetokenizeManager(tok), 0, ids)
    assert "".join(pieces) == tok.decode(ids)
    assert not any(p.endswith(REPLACEMENT_CHAR) for p in pieces[:-1])


_TOKENIZER = load_tokenizer(MODEL)


def test_interleaved_requests_keep_their_own_state(tokenizer) -> None:
    manager = DetokenizeManager(tokenizer)
    ids = {uid: tokenizer.encode(t) for uid, t in enumerate(TEXTS)}
    out: Dict[int, str] = {uid: "" for uid in ids}
    for step in range(max(map(len, ids.values()))):
        batch = [
            DetokenizeMsg(uid, seq[step], step == len(seq) - 1)
            for uid, seq in ids.items()
            if step < len(seq)
        ]
        for msg, piece in zip(batch, manager.detokenize(batch)):
            out[msg.uid] += piece
    assert out == dict(enumerate(TEXTS)) and manager.decode_map == {}


def test_several_tokens_of_one_request_in_one_call(tokenizer) -> None:
    ids = tokenizer.encode(TEXTS[1])
    manager = DetokenizeManager(tokenizer)
    first = manager.detokenize([DetokenizeMsg(0, t, False) for t in ids[:5]])
    rest = manager.detokenize(
        [DetokenizeMsg(0, t, i == len(ids) - 6) for i, t in enumerate(ids[5:])]
    )
    assert "".join(first + rest) == TEXTS[1] and manager.decode_map == {}


def test_finished_aborted_and_refused_requests_leave_no_state(tokenizer) -> None:
    manager = DetokenizeManager(tokenizer)
    manager.detokenize([DetokenizeMsg(1, 100, False), DetokenizeMsg(2, 200, False)])
    manager.abort(1)
    assert manager.detokenize([DetokenizeMsg(3, -1, True, error="too long")]) == [""]
    assert set(manager.decode_map) == {2}
    manager.detokenize([DetokenizeMsg(2, tokenizer.eos_token_id, True)])
    assert manager.decode_map == {}


def test_a_request_that_ends_inside_a_character_sends_what_it_has(tokenizer) -> None:
    ids = tokenizer.encode("ok 🚀")[:-1]  # stop one token short of the emoji's end
    pieces = stream(DetokenizeManager(tokenizer), 0, ids)
    assert "".join(pieces) == tokenizer.decode(ids) and pieces[-1].endswith(REPLACEMENT_CHAR)


# ------------------------------------------------------------------------------ the worker
@pytest.fixture
def folder() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="minisgl-test-") as path:
        yield f"ipc://{path}"


def unwrap(msg) -> List:
    return (
        msg.data
        if isinstance(msg, (BatchBackendMsg, BatchFrontendMsg, BatchTokenizerMsg))
        else [msg]
    )


def receive_n(queue: ZmqPullQueue, count: int, worker: mp.Process) -> List:
    """The next `count` messages, leaving out the prompt token counts that the worker sends
    the API server from chapter 15 on (they are not this chapter's)."""
    got: List = []
    while len(got) < count:
        msgs = unwrap(receive(queue, [worker], 60, f"message {len(got) + 1} of {count}"))
        got.extend(m for m in msgs if getattr(m, "prompt_tokens", None) is None)
    return got


def start_worker(folder: str, local_bs: int = 4) -> mp.Process:
    """A tokenizer worker in a fresh interpreter, once it has said it is ready."""
    ack: mp.Queue = worker_context(["minisgl.tokenizer"]).Queue()
    worker = worker_context(["minisgl.tokenizer"]).Process(
        target=tokenize_worker,
        kwargs=dict(
            tokenizer_path=str(ensure_model(MODEL)),
            addr=f"{folder}/tokenizer",
            create=True,
            backend_addr=f"{folder}/backend",
            frontend_addr=f"{folder}/frontend",
            local_bs=local_bs,
            tokenizer_id=0,
            ack_queue=ack,
        ),
    )
    worker.start()
    try:
        assert ack.get(timeout=60) == "Tokenize server 0 is ready"
    except BaseException:
        worker.kill()
        raise
    return worker


def test_the_worker_tokenizes_detokenizes_and_forwards_aborts(folder: str, tokenizer) -> None:
    backend = ZmqPullQueue(f"{folder}/backend", create=True, decoder=BaseBackendMsg.decoder)
    frontend = ZmqPullQueue(f"{folder}/frontend", create=True, decoder=BaseFrontendMsg.decoder)
    to_worker = ZmqPushQueue(f"{folder}/tokenizer", create=False, encoder=BaseTokenizerMsg.encoder)
    worker = start_worker(folder)
    try:
        with stopped_on_exit(worker):
            params = SamplingParams(max_tokens=3)
            to_worker.put(
                BatchTokenizerMsg(
                    [
                        TokenizeMsg(0, TEXTS[0], params),
                        TokenizeMsg(1, [{"role": "user", "content": "Hi!"}], params),
                        TokenizeMsg(
                            2, 12345, params
                        ),  # not text: refused, the worker keeps serving
                        AbortMsg(0),
                    ]
                )
            )
            got = receive_n(backend, 3, worker)
            assert [type(m) for m in got] == [
                UserMsg,
                UserMsg,
                AbortBackendMsg,
            ]  # arrival order kept
            assert (
                got[0].input_ids.tolist() == tokenizer.encode(TEXTS[0])
                and got[0].sampling_params == params
            )
            chat = tokenizer.apply_chat_template(
                [{"role": "user", "content": "Hi!"}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
            assert got[1].input_ids.tolist() == list(chat)
            refusal = receive_n(frontend, 1, worker)[0]
            assert refusal.uid == 2 and refusal.finished and "cannot tokenize" in refusal.error

            ids = tokenizer.encode(TEXTS[1])
            for i, t in enumerate(ids):
                to_worker.put(DetokenizeMsg(1, t, i == len(ids) - 1))
            replies = receive_n(frontend, len(ids), worker)
            assert "".join(r.incremental_output for r in replies) == TEXTS[1]
            assert [r.finished for r in replies] == [False] * (len(ids) - 1) + [True]
            worker.terminate()  # SIGTERM: the worker leaves its loop and closes its sockets
            finish([worker], timeout=10)  # exit code 0, or this raises
    finally:
        for q in (to_worker, backend, frontend):
            q.stop()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_the_worker_stops_on_a_signal_even_if_it_inherited_sigint_ignored(
    folder: str, how: str
) -> None:
    """A program started in the background by a script inherits SIGINT ignored, and passes
    that on to its children; Python then never turns SIGINT into KeyboardInterrupt. The
    worker sets its own handlers, so the signal still ends it, with exit code 0."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what the child will inherit
    try:
        worker = start_worker(folder)
    finally:
        signal.signal(signal.SIGINT, previous)
    with stopped_on_exit(worker):
        os.kill(worker.pid, getattr(signal, how))
        finish([worker], timeout=10)


def spawn_and_vanish(folder: str, pid_file: str) -> None:
    """A parent that starts a worker and then dies without stopping it."""
    from tools.warm_forkserver import install

    install()  # this process's fork server: a copy of it, not a fresh interpreter (4 s of a core)
    worker = start_worker(folder)
    with open(pid_file, "w") as f:
        f.write(str(worker.pid))
    os._exit(0)


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (exited, not yet reaped by whoever adopted it) is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_an_orphaned_worker_stops_by_itself(folder: str, tmp_path) -> None:
    pid_file = str(tmp_path / "worker.pid")
    parent = worker_context([__name__]).Process(target=spawn_and_vanish, args=(folder, pid_file))
    parent.start()
    parent.join(90)
    assert parent.exitcode == 0
    pid = int(open(pid_file).read())
    deadline = time.monotonic() + 15
    while not is_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not is_gone(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the worker (pid {pid}) outlived its parent by 15 s")
