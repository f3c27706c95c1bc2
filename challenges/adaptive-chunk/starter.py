"""Your schedule_step (challenge adaptive-chunk).
Run: python tools/challenge.py check adaptive-chunk"""

from __future__ import annotations

from minisgl.core import Batch
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager


def schedule_step(
    prefill_manager: PrefillManager, decode_manager: DecodeManager, max_step_tokens: int
) -> Batch | None:
    raise NotImplementedError("the next batch: at most max_step_tokens tokens in all")
