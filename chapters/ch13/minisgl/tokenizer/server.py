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
    batch), and handles them by kind: detokenize and reply to the API server, tokenize and
    send to the scheduler, forward aborts."""
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
                replies = [
                    UserReply(m.uid, piece, m.finished, error=m.error)
                    for m, piece in zip(detokenize, pieces)
                ]
                send_frontend.put(_batched(replies, BatchFrontendMsg))

            requests: List[BaseBackendMsg] = []
            refusals: List[BaseFrontendMsg] = []
            for m in pending:
                if isinstance(m, TokenizeMsg):
                    try:
                        input_ids = tokenize_manager.tokenize_one(m)
                    except Exception as e:  # a bad chat, say: refuse this request, keep serving
                        logger.warning(f"request {m.uid} refused: cannot tokenize it: {e}")
                        refusals.append(UserReply(m.uid, "", True, error=f"cannot tokenize: {e}"))
                        continue
                    requests.append(UserMsg(m.uid, input_ids, m.sampling_params))
                elif isinstance(m, AbortMsg):
                    detokenize_manager.abort(m.uid)
                    requests.append(AbortBackendMsg(m.uid))
            if requests:
                send_backend.put(_batched(requests, BatchBackendMsg))
            if refusals:
                send_frontend.put(_batched(refusals, BatchFrontendMsg))
    except KeyboardInterrupt:
        pass
    finally:
        for queue in (recv_listener, send_backend, send_frontend):
            queue.stop()
