from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.core import SamplingParams


@dataclass
class PendingReq:
    """A request that has arrived but is not running yet."""

    uid: int
    input_ids: torch.Tensor  # the prompt, on the CPU
    sampling_params: SamplingParams

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def output_len(self) -> int:
        return self.sampling_params.max_tokens
