"""Messages into the API server: a piece of a request's output text."""

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
