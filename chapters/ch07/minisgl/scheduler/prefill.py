"""Admitting waiting requests into a prefill batch.

This first version admits requests in arrival order while there is a free request slot and
prompt-token budget left; chapter 08 adds the memory check and the prefix cache, chapter 10
splits prompts that do not fit the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List

from minisgl.core import Batch, Req

from .utils import PendingReq

if TYPE_CHECKING:
    from minisgl.message import UserMsg

    from .cache import CacheManager
    from .decode import DecodeManager
    from .table import TableManager


@dataclass
class PrefillAdder:
    token_budget: int
    cache_manager: CacheManager
    table_manager: TableManager

    def try_add_one(self, pending_req: PendingReq) -> Req | None:
        if self.token_budget <= 0 or self.table_manager.available_size == 0:
            return None
        table_idx = self.table_manager.allocate()
        self.token_budget -= pending_req.input_len
        # the prompt goes into the request's row of the token pool, where the forward pass
        # reads its input ids
        row = self.table_manager.token_pool[table_idx, : pending_req.input_len]
        row.copy_(pending_req.input_ids, non_blocking=True)
        return Req(
            input_ids=pending_req.input_ids,
            table_idx=table_idx,
            cached_len=0,
            output_len=pending_req.output_len,
            uid=pending_req.uid,
            sampling_params=pending_req.sampling_params,
            cache_handle=None,  # type: ignore[arg-type]  # chapter 08's prefix cache
        )


@dataclass
class PrefillManager:
    cache_manager: CacheManager
    table_manager: TableManager
    decode_manager: DecodeManager
    pending_list: List[PendingReq] = field(default_factory=list)

    def add_one_req(self, req: UserMsg) -> None:
        self.pending_list.append(PendingReq(req.uid, req.input_ids, req.sampling_params))

    def schedule_next_batch(self, prefill_budget: int) -> Batch | None:
        if not self.pending_list:
            return None
        adder = PrefillAdder(prefill_budget, self.cache_manager, self.table_manager)
        reqs: List[Req] = []
        for pending_req in self.pending_list:
            req = adder.try_add_one(pending_req)
            if req is None:
                break  # first come, first served: no overtaking
            reqs.append(req)
        if not reqs:
            return None
        self.pending_list = self.pending_list[len(reqs) :]
        return Batch(reqs=reqs, phase="prefill")

    def abort_req(self, uid: int) -> Req | None:
        """Drop a waiting request; nothing was allocated for it yet."""
        for i, req in enumerate(self.pending_list):
            if req.uid == uid:
                self.pending_list.pop(i)
                return None
        return None

    @property
    def runnable(self) -> bool:
        return len(self.pending_list) > 0
