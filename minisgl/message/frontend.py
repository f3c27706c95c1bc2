"""Messages into the API server: a piece of a request's output text, and its counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from .utils import deserialize_type, serialize_type


@dataclass
class BaseFrontendMsg:
    @staticmethod
    def encoder(msg: BaseFrontendMsg) -> Dict:
        return serialize_type(msg)

    @staticmethod
    def decoder(json: Dict) -> BaseFrontendMsg:
        msg = deserialize_type(globals(), json)
        if not isinstance(msg, BaseFrontendMsg):
            raise ValueError(f"not a message for the API server: {type(msg).__name__}")
        return msg


@dataclass
class BatchFrontendMsg(BaseFrontendMsg):
    data: List[BaseFrontendMsg]


@dataclass
class UserReply(BaseFrontendMsg):
    uid: int
    incremental_output: str  # the text that is new since the last reply
    finished: bool
    error: str | None = None  # why the request was refused, if it was
    # the API server's counts (chapter 15): a reply with prompt_tokens set carries no text and
    # comes first, from the tokenizer; the last reply says why the request finished
    prompt_tokens: int | None = None
    finish_reason: str | None = None  # "stop" (at the EOS) or "length"
    carries_token: bool = True  # False for the one reply of a request with max_tokens=0
