"""Admitting waiting requests into a prefill batch.

Requests are admitted in arrival order while there is a free request slot, prompt-token
budget left, and memory for the whole request: the prompt tokens it must compute plus every
token it may generate, on top of what the running requests may still need. A request that
does not fit waits; nothing is ever admitted that could run out of pages later.

A prompt longer than what is left of the budget is prefilled in chunks: this batch computes
as much as the budget allows, and the request goes back to the front of the waiting list as
a ChunkedReq, to continue in the next prefill batch. Running requests keep decoding in
between, and no single batch grows beyond the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Tuple

import torch

from minisgl.core import Batch, Req
from minisgl.utils import align_ceil

from .utils import PendingReq

if TYPE_CHECKING:
    from minisgl.kvcache import BaseCacheHandle
    from minisgl.message import UserMsg

    from .cache import CacheManager
    from .decode import DecodeManager
    from .table import TableManager


class ChunkedReq(Req):
    """A request whose prompt is only partly prefilled: it samples nothing and never decodes."""

    def append_host(self, next_token: torch.Tensor) -> None:
        raise NotImplementedError("a partly prefilled request has no next token")

    @property
    def can_decode(self) -> bool:
        return False  # keeps it out of the decode manager


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
        return align_ceil(req.input_len + req.output_len, page_size) - align_ceil(
            cached_len, page_size
        )

    def _add_one_req(
        self,
        pending_req: PendingReq,
        cache_handle: BaseCacheHandle,
        table_idx: int,
        cached_len: int,
    ) -> Req:
        remain_len = pending_req.input_len - cached_len
        chunk_size = min(self.token_budget, remain_len)
        is_chunked = chunk_size < remain_len
        self.token_budget -= chunk_size
        self.reserved_size += self._new_slots(pending_req, cached_len)
        # this chunk of the prompt goes into the token pool, where the forward pass reads it;
        # its pages are allocated when the batch is prepared
        chunk = slice(cached_len, cached_len + chunk_size)
        self.table_manager.token_pool[table_idx, chunk].copy_(pending_req.input_ids[chunk])
        return (ChunkedReq if is_chunked else Req)(
            input_ids=pending_req.input_ids[: cached_len + chunk_size],
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
        if chunked_req := pending_req.chunked_req:  # admitted already: continue its prompt
            return self._add_one_req(
                pending_req, chunked_req.cache_handle, chunked_req.table_idx, chunked_req.cached_len
            )
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
        chunked_list: List[PendingReq] = []
        for pending_req in self.pending_list:
            req = adder.try_add_one(pending_req)
            if req is None:
                break  # first come, first served: no overtaking
            pending_req.chunked_req = None
            if isinstance(req, ChunkedReq):  # to be continued, first in line
                pending_req.chunked_req = req
                chunked_list.append(pending_req)
            reqs.append(req)
        if not reqs:
            return None
        self.pending_list = chunked_list + self.pending_list[len(reqs) :]
        return Batch(reqs=reqs, phase="prefill")

    def forget(self, uid: int) -> None:
        """Drop request `uid` from the waiting list, if it is there (its resources are the
        caller's business)."""
        self.pending_list = [req for req in self.pending_list if req.uid != uid]

    def abort_req(self, uid: int) -> Req | None:
        """Drop a waiting request. A partly prefilled one is returned: its slot and pages must
        be freed; a request that never started holds nothing."""
        for i, req in enumerate(self.pending_list):
            if req.uid == uid:
                self.pending_list.pop(i)
                return req.chunked_req
        return None

    @property
    def runnable(self) -> bool:
        return len(self.pending_list) > 0
