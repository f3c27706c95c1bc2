"""Chapter 14: the scheduler as a process driven only by messages.

The scheduler of chapter 11 gets its own input and output (SchedulerIOMixin): offline, the
driver's methods as before (LLM); online, sockets at addresses its config names, different for
every config, so that two servers on one machine never meet. This process plays the tokenizer
and the detokenizer: it sends token ids to a scheduler process and reads the tokens it sends
back, and they must match transformers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "ERROR")  # the scheduler logs each refusal as a warning
from examples.helpers.scheduler_process import run_scheduler  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.distributed import DistributedInfo  # noqa: E402
from minisgl.message import (  # noqa: E402
    BaseBackendMsg,
    BaseTokenizerMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    UserMsg,
)
from minisgl.scheduler import SchedulerConfig  # noqa: E402
from minisgl.utils import ZmqPullQueue, ZmqPushQueue, worker_context  # noqa: E402
from tools.models import DEMO_MODEL, ensure_model  # noqa: E402
from tools.parity import book_dtype, load_tokenizer, run_parity  # noqa: E402
from tools.processes import finish, receive, stopped_on_exit  # noqa: E402

REPLY_TIMEOUT_S = 120  # a scheduler that sends nothing for this long is stuck


def make_config(name: str) -> SchedulerConfig:
    return SchedulerConfig(
        model_path=str(ensure_model(name)),
        tp_info=DistributedInfo(0, 1),
        dtype=book_dtype(),
        max_running_req=8,
        page_size=4,
        num_page_override=1024,
    )


def show_addresses() -> None:
    a, b = make_config(DEMO_MODEL), make_config(DEMO_MODEL)
    print("two configs made one after the other, in one process:")
    for field in ("zmq_backend_addr", "zmq_detokenizer_addr", "zmq_scheduler_broadcast_addr"):
        shown = getattr(a, field).replace(tempfile.gettempdir(), "<tmp>")
        shown = shown.replace(a._unique_suffix, "<pid>-<n>")
        print(f"  {field:29s} {shown:44s} differ: {getattr(a, field) != getattr(b, field)}")
    rank1 = replace(a, tp_info=DistributedInfo(1, 2))
    same = rank1.zmq_backend_addr == a.zmq_backend_addr
    print(f"  rank 1's copy of a (dataclasses.replace) has the same addresses: {same}\n")


class SchedulerClient:
    """A scheduler process and the two sockets that talk to it, gone when the block ends."""

    def __init__(self, name: str) -> None:
        self.config = make_config(name)
        self.requests = ZmqPushQueue(
            self.config.zmq_backend_addr, create=False, encoder=BaseBackendMsg.encoder
        )
        self.replies = ZmqPullQueue(
            self.config.zmq_detokenizer_addr, create=False, decoder=BaseTokenizerMsg.decoder
        )
        ready: mp.Queue = worker_context(["minisgl.scheduler"]).Queue()
        self.process = worker_context(["minisgl.scheduler"]).Process(
            target=run_scheduler, args=(self.config, ready), name=f"scheduler({name})"
        )
        self.process.start()
        self.ready = ready

    def __enter__(self) -> "SchedulerClient":
        self._stopper = stopped_on_exit(self.process)
        self._stopper.__enter__()
        self.ready.get(timeout=REPLY_TIMEOUT_S)
        return self

    def replies_until_done(self, uids: List[int]) -> Dict[int, List[DetokenizeMsg]]:
        """Every reply for `uids`, until each has one flagged finished."""
        got: Dict[int, List[DetokenizeMsg]] = {uid: [] for uid in uids}
        running = set(uids)
        while running:
            reply = receive(self.replies, [self.process], REPLY_TIMEOUT_S, "the tokens")
            for msg in reply.data if isinstance(reply, BatchTokenizerMsg) else [reply]:
                got[msg.uid].append(msg)
                if msg.finished:
                    running.discard(msg.uid)
        return got

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.requests.put(ExitMsg())
                finish([self.process])  # it exits with code 0 within 30 s, or this raises
        finally:
            self._stopper.__exit__(*exc)
            self.requests.stop()
            self.replies.stop()


def show_a_conversation() -> None:
    tok = load_tokenizer(DEMO_MODEL)
    prompt = tok("The capital of France is").input_ids
    sent = {
        0: UserMsg(0, torch.tensor(prompt, dtype=torch.int32), SamplingParams(max_tokens=8)),
        1: UserMsg(1, torch.tensor([5, 49152], dtype=torch.int32), SamplingParams(max_tokens=8)),
        2: UserMsg(2, torch.tensor(prompt, dtype=torch.int32), SamplingParams(max_tokens=0)),
    }
    print("a scheduler process, fed over its sockets:")
    with SchedulerClient(DEMO_MODEL) as scheduler:
        scheduler.requests.put(BatchBackendMsg(list(sent.values())))
        got = scheduler.replies_until_done(list(sent))
    for uid, replies in got.items():
        tokens = [m.next_token for m in replies if m.next_token >= 0]
        what = f"refused: {replies[-1].error}" if replies[-1].error else repr(tok.decode(tokens))
        asked = (
            f"{len(sent[uid].input_ids)} tokens, max_tokens={sent[uid].sampling_params.max_tokens}"
        )
        count = f"{len(replies)} repl{'y' if len(replies) == 1 else 'ies'}"
        print(f"  request {uid} ({asked}): {count}, {what}")
    print()


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    with SchedulerClient(name) as scheduler:
        scheduler.requests.put(
            BatchBackendMsg(
                [
                    UserMsg(uid, torch.tensor(p, dtype=torch.int32), SamplingParams(max_tokens=n))
                    for uid, p in enumerate(prompts)
                ]
            )
        )
        got = scheduler.replies_until_done(list(range(len(prompts))))
    return [[m.next_token for m in got[uid]] for uid in range(len(prompts))]


def main() -> int:
    show_addresses()
    show_a_conversation()
    print("one scheduler process per model, requests and tokens over its sockets:")
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
