"""Your PrefixFirstPrefillManager (challenge prefix-first).
Run: python tools/challenge.py check prefix-first"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.scheduler.prefill import PrefillManager

if TYPE_CHECKING:
    from minisgl.core import Batch


class PrefixFirstPrefillManager(PrefillManager):
    # made as PrefixFirstPrefillManager(cache_manager, table_manager, decode_manager), the
    # arguments of PrefillManager; override add_one_req too if your ranking needs to

    def schedule_next_batch(self, prefill_budget: int) -> Batch | None:
        raise NotImplementedError("rank the waiting requests by cached prefix, then admit")
