"""Messages into the tokenizer workers: text to tokenize (from the API server), tokens to
detokenize (from the scheduler), and aborts.

One tokenizer process may do both jobs, so both kinds share one base class and one socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from minisgl.core import SamplingParams

from .utils import deserialize_type, serialize_type


@dataclass
class BaseTokenizerMsg:
    @staticmethod
    def encoder(msg: BaseTokenizerMsg) -> Dict:
        return serialize_type(msg)

    @staticmethod
    def decoder(json: Dict) -> BaseTokenizerMsg:
        msg = deserialize_type(globals(), json)
        if not isinstance(msg, BaseTokenizerMsg):
            raise ValueError(f"not a message for a tokenizer: {type(msg).__name__}")
        return msg


@dataclass
class BatchTokenizerMsg(BaseTokenizerMsg):
    data: List[BaseTokenizerMsg]


@dataclass
class DetokenizeMsg(BaseTokenizerMsg):
    uid: int
    next_token: int  # -1 when the request was refused
    finished: bool
    error: str | None = None  # why a request was refused (it then carries no token)


@dataclass
class TokenizeMsg(BaseTokenizerMsg):
    uid: int
    text: str | List[Dict[str, str]]  # a prompt, or chat messages for the chat template
    sampling_params: SamplingParams


@dataclass
class AbortMsg(BaseTokenizerMsg):
    uid: int
