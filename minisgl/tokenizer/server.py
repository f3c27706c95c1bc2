"""The tokenizer worker: a process that tokenizes prompts for the scheduler and detokenizes
the scheduler's tokens for the API server, with one socket in and two out."""

from __future__ import annotations

import multiprocessing as mp
from typing import List

import torch

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
    UserReply,
)
from minisgl.utils import ZmqPullQueue, ZmqPushQueue, init_logger, load_tokenizer, make_stoppable


def _unwrap_msg(msg: BaseTokenizerMsg) -> List[BaseTokenizerMsg]:
    return msg.data if isinstance(msg, BatchTokenizerMsg) else [msg]


def _reply(msg: DetokenizeMsg, piece: str, eos: int | None) -> UserReply:
    """The API server's reply; the last one says why the request finished: "stop" at its EOS,
    "length" when its budget ran out (max_tokens=0 included: that reply has no token)."""
    why = None
    if msg.finished and msg.error is None:
        why = "stop" if msg.next_token == eos else "length"
    return UserReply(msg.uid, piece, msg.finished, msg.error, finish_reason=why,
                     carries_token=msg.next_token >= 0)  # fmt: skip


def _batched(msgs: List, batch_cls: type):
    """One message as itself, several in one batch message."""
    return msgs[0] if len(msgs) == 1 else batch_cls(data=msgs)


@torch.inference_mode()
def tokenize_worker(
    *,
    tokenizer_path: str,
    addr: str,
    create: bool,
    backend_addr: str,
    frontend_addr: str,
    local_bs: int,
    tokenizer_id: int = -1,
    model_source: str = "huggingface",
    ack_queue: mp.Queue[str] | None = None,
) -> None:
    """Serve until stopped (SIGINT, SIGTERM, or the parent's death: see make_stoppable).
    Each turn takes the messages that have arrived, up to `local_bs` (more if they came in one
    batch), and handles them by kind: detokenize and reply to the API server (the last reply
    of a request says why it finished), tokenize, tell the API server the prompt's length and
    send it to the scheduler, forward aborts."""
    make_stoppable()
    if local_bs <= 0:
        raise ValueError(f"local_bs must be positive, not {local_bs}")
    if model_source != "huggingface":
        raise ValueError(f"unknown model source {model_source!r}: only 'huggingface' is supported")
    from .detokenize import DetokenizeManager
    from .tokenize import TokenizeManager

    logger = init_logger(__name__, f"tokenizer_{tokenizer_id}")
    send_backend = ZmqPushQueue(backend_addr, create=False, encoder=BaseBackendMsg.encoder)
    send_frontend = ZmqPushQueue(frontend_addr, create=False, encoder=BaseFrontendMsg.encoder)
    recv_listener = ZmqPullQueue(addr, create=create, decoder=BaseTokenizerMsg.decoder)
    tokenizer = load_tokenizer(tokenizer_path)
    eos = tokenizer.eos_token_id
    tokenize_manager = TokenizeManager(tokenizer)
    detokenize_manager = DetokenizeManager(tokenizer)
    if ack_queue is not None:
        ack_queue.put(f"Tokenize server {tokenizer_id} is ready")

    try:
        while True:
            pending = _unwrap_msg(recv_listener.get())
            while len(pending) < local_bs and not recv_listener.empty():
                pending.extend(_unwrap_msg(recv_listener.get()))
            logger.debug(f"received {len(pending)} messages")

            detokenize = [m for m in pending if isinstance(m, DetokenizeMsg)]
            if detokenize:
                pieces = detokenize_manager.detokenize(detokenize)
                replies = [_reply(m, piece, eos) for m, piece in zip(detokenize, pieces)]
                send_frontend.put(_batched(replies, BatchFrontendMsg))

            requests: List[BaseBackendMsg] = []
            to_frontend: List[BaseFrontendMsg] = []  # prompt token counts and refusals
            for m in pending:
                if isinstance(m, TokenizeMsg):
                    try:
                        input_ids = tokenize_manager.tokenize_one(m)
                    except Exception as e:  # a bad chat, say: refuse this request, keep serving
                        logger.warning(f"request {m.uid} refused: cannot tokenize it: {e}")
                        to_frontend.append(
                            UserReply(m.uid, "", True, error=f"cannot tokenize: {e}")
                        )
                        continue
                    requests.append(UserMsg(m.uid, input_ids, m.sampling_params))
                    to_frontend.append(UserReply(m.uid, "", False, prompt_tokens=len(input_ids)))
                elif isinstance(m, AbortMsg):
                    detokenize_manager.abort(m.uid)
                    requests.append(AbortBackendMsg(m.uid))
            if to_frontend:  # before the requests: a count always comes before the tokens
                send_frontend.put(_batched(to_frontend, BatchFrontendMsg))
            if requests:
                send_backend.put(_batched(requests, BatchBackendMsg))
    except KeyboardInterrupt:
        pass
    finally:
        for queue in (recv_listener, send_backend, send_frontend):
            queue.stop()
