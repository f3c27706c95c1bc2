"""The book's PrefixFirstPrefillManager: before every round, rank the waiting requests by how
much of their prompt the radix cache holds, then let the engine's own loop admit along the
ranking (it stops at the first request that does not fit)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Tuple

from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.utils import PendingReq

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.message import UserMsg
    from minisgl.scheduler.cache import CacheManager
    from minisgl.scheduler.decode import DecodeManager
    from minisgl.scheduler.table import TableManager


class ArrivedReq(PendingReq):
    def __init__(self, msg: UserMsg, arrival: int) -> None:
        super().__init__(msg.uid, msg.input_ids, msg.sampling_params)
        self.arrival = arrival  # the how-manieth request this manager received


class PrefixFirstPrefillManager(PrefillManager):
    def __init__(
        self,
        cache_manager: CacheManager,
        table_manager: TableManager,
        decode_manager: DecodeManager,
    ) -> None:
        super().__init__(cache_manager, table_manager, decode_manager)
        self._arrivals = itertools.count()

    def add_one_req(self, req: UserMsg) -> None:
        self.pending_list.append(ArrivedReq(req, next(self._arrivals)))

    def _rank(self, req: PendingReq) -> Tuple[int, int, int]:
        assert isinstance(req, ArrivedReq), "requests join through add_one_req"
        if req.chunked_req is not None:
            # its first round reserved memory for all of it, which only holds if it is
            # counted before anyone else is checked (chapter 10)
            return (0, 0, req.arrival)
        # the very match admission will make: whole pages, short of the last prompt token
        cached = self.cache_manager.match_req(req).cuda_handle.cached_len
        return (1, -cached, req.arrival)

    def schedule_next_batch(self, prefill_budget: int) -> Batch | None:
        self.pending_list.sort(key=self._rank)
        return super().schedule_next_batch(prefill_budget)
