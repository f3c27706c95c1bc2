"""Your PriorityPrefillManager (challenge priority-admission).
Run: python tools/challenge.py check priority-admission"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict

from minisgl.scheduler.prefill import PrefillManager

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.message import UserMsg
    from minisgl.scheduler.cache import CacheManager
    from minisgl.scheduler.decode import DecodeManager
    from minisgl.scheduler.table import TableManager


class PriorityPrefillManager(PrefillManager):
    def __init__(
        self,
        cache_manager: CacheManager,
        table_manager: TableManager,
        decode_manager: DecodeManager,
        priority: Dict[int, int] | None = None,  # uid -> priority, higher first; absent: 0
        max_wait: int = 8,  # K
    ) -> None:
        super().__init__(cache_manager, table_manager, decode_manager)
        self.priority = dict(priority or {})
        self.max_wait = max_wait

    def add_one_req(self, req: UserMsg) -> None:
        super().add_one_req(req)  # and keep what your ranking needs to know about it

    def schedule_next_batch(self, prefill_budget: int) -> Batch | None:
        raise NotImplementedError("rank the waiting requests, then admit along the ranking")
