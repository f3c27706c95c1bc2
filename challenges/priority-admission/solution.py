"""The book's PriorityPrefillManager: rank the waiting list before every round, then let the
engine's own loop admit along the ranking. That loop stops at the first request that does not
fit, so the ranking alone decides who may overtake whom."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Dict, Tuple

from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.utils import PendingReq

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.message import UserMsg
    from minisgl.scheduler.cache import CacheManager
    from minisgl.scheduler.decode import DecodeManager
    from minisgl.scheduler.table import TableManager


class QueuedReq(PendingReq):
    """A waiting request with what its rank depends on."""

    def __init__(self, msg: UserMsg, priority: int, arrival: int) -> None:
        super().__init__(msg.uid, msg.input_ids, msg.sampling_params)
        self.priority = priority
        self.arrival = arrival  # the how-manieth request this manager received
        self.waited = 0  # rounds spent in the waiting list


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
        self._arrivals = itertools.count()

    def add_one_req(self, req: UserMsg) -> None:
        priority = self.priority.get(req.uid, 0)
        self.pending_list.append(QueuedReq(req, priority, next(self._arrivals)))

    def _rank(self, req: PendingReq) -> Tuple[int, int, int]:
        assert isinstance(req, QueuedReq), "requests join through add_one_req"
        if req.chunked_req is not None:
            # its first round reserved memory for all of it, which only holds if it is
            # counted before anyone else is checked (chapter 10)
            return (0, 0, req.arrival)
        if req.waited >= self.max_wait:
            return (1, 0, req.arrival)
        return (2, -req.priority, req.arrival)

    def schedule_next_batch(self, prefill_budget: int) -> Batch | None:
        self.pending_list.sort(key=self._rank)
        batch = super().schedule_next_batch(prefill_budget)
        for req in self.pending_list:  # those left waiting
            assert isinstance(req, QueuedReq)
            req.waited += 1
        return batch
