"""Messages into the scheduler (the "backend"): new requests, aborts, exit.

The tokenizer sends them; `encoder` turns one into plain data for msgpack and `decoder` makes
it again on the scheduler's side, knowing only the classes of this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch

from minisgl.core import SamplingParams

from .utils import deserialize_type, serialize_type


@dataclass
class BaseBackendMsg:
    def encoder(self) -> Dict:
        return serialize_type(self)

    @staticmethod
    def decoder(json: Dict) -> BaseBackendMsg:
        msg = deserialize_type(globals(), json)
        if not isinstance(msg, BaseBackendMsg):
            raise ValueError(f"not a message for the scheduler: {type(msg).__name__}")
        return msg


@dataclass
class BatchBackendMsg(BaseBackendMsg):
    data: List[BaseBackendMsg]


@dataclass
class ExitMsg(BaseBackendMsg):
    pass


@dataclass
class UserMsg(BaseBackendMsg):
    uid: int
    input_ids: torch.Tensor  # on the CPU, 1-D, int32
    sampling_params: SamplingParams


@dataclass
class AbortBackendMsg(BaseBackendMsg):
    uid: int
