"""Messages into the scheduler (the "backend"): new requests, aborts, exit.

In this chapter they travel by plain function calls; chapter 12 adds their serialisation for
ZMQ sockets between processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import SamplingParams


@dataclass
class BaseBackendMsg:
    pass


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
