"""Messages out of the scheduler, towards the detokenizer: one new token of one request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List


@dataclass
class BaseTokenizerMsg:
    pass


@dataclass
class BatchTokenizerMsg(BaseTokenizerMsg):
    data: List[BaseTokenizerMsg]


@dataclass
class DetokenizeMsg(BaseTokenizerMsg):
    uid: int
    next_token: int  # -1 when the request was refused
    finished: bool
    error: str | None = None  # why a request was refused (it then carries no token)
