"""Admitting waiting requests into a prefill batch.

Requests are admitted in arrival order while there is a free request slot, prompt-token
budget left, and memory for the whole request: the prompt tokens it must compute plus every
token it may generate, on top of what the running requests may still need. A request that
does not fit waits; nothing is ever admitted that could run out of pages later. Chapter 10
splits prompts that do not fit the token budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Tuple

from minisgl.core import Batch, Req
from minisgl.utils import align_ceil

from .utils import PendingReq

if TYPE_CHECKING:
    from minisgl.kvcache import BaseCacheHandle
    from minisgl.message import UserMsg

    from .cache import CacheManager
    from .decode import DecodeManager
    from .table import TableManager


@dataclass
class PrefillAdder:
    token_budget: int  # prompt tokens this batch may still compute
    reserved_size: int  # token slots already promised (running requests, earlier admissions)
    cache_manager: CacheManager
    table_manager: TableManager

    def _try_allocate_one(self, req: PendingReq) -> Tuple[BaseCacheHandle, int] | None:
        """A request slot and a locked prefix match for `req`, if its whole future fits."""
        if self.table_manager.available_size == 0:
            return None
        handle = self.cache_manager.match_req(req).cuda_handle
        estimated_len = self._new_slots(req, handle.cached_len)
        if estimated_len + self.reserved_size > self.cache_manager.available_size:
            return None
        # locking takes the matched prefix out of the evictable part: check again
        self.cache_manager.lock(handle)
        if estimated_len + self.reserved_size > self.cache_manager.available_size:
            self.cache_manager.unlock(handle)
            return None
        table_idx = self.table_manager.allocate()
        if handle.cached_len > 0:  # the matched prefix: its tokens and its KV slots
            cached = slice(0, handle.cached_len)
            self.table_manager.token_pool[table_idx, cached].copy_(req.input_ids[cached])
            self.table_manager.page_table[table_idx, cached].copy_(handle.get_matched_indices())
        return handle, table_idx

    def _new_slots(self, req: PendingReq, cached_len: int) -> int:
        """Token slots the request will take beyond its cached prefix, to its last possible
        token, counted in whole pages: its last page may be only partly used."""
        page_size = self.cache_manager.page_size
        return align_ceil(req.input_len + req.output_len, page_size) - cached_len

    def _add_one_req(
        self,
        pending_req: PendingReq,
        cache_handle: BaseCacheHandle,
        table_idx: int,
        cached_len: int,
    ) -> Req:
        remain_len = pending_req.input_len - cached_len
        self.token_budget -= remain_len
        self.reserved_size += self._new_slots(pending_req, cached_len)
        # the rest of the prompt goes into the token pool, where the forward pass reads it;
        # its pages are allocated when the batch is prepared
        rest = slice(cached_len, pending_req.input_len)
        self.table_manager.token_pool[table_idx, rest].copy_(pending_req.input_ids[rest])
        return Req(
            input_ids=pending_req.input_ids,
            table_idx=table_idx,
            cached_len=cached_len,
            output_len=pending_req.output_len,
            uid=pending_req.uid,
            sampling_params=pending_req.sampling_params,
            cache_handle=cache_handle,
        )

    def try_add_one(self, pending_req: PendingReq) -> Req | None:
        if self.token_budget <= 0:
            return None
        if resource := self._try_allocate_one(pending_req):
            cache_handle, table_idx = resource
            return self._add_one_req(pending_req, cache_handle, table_idx, cache_handle.cached_len)
        return None


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
        adder = PrefillAdder(
            token_budget=prefill_budget,
            reserved_size=self.decode_manager.inflight_tokens,  # what running requests may need
            cache_manager=self.cache_manager,
            table_manager=self.table_manager,
        )
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
