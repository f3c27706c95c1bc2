"""The CacheManager: KV pages for the running requests, and the prefix cache beside them.

Every page is in exactly one of three places: the free list, the prefix cache (which owns the
pages of cached prefixes), or a running request (which owns the pages of its own tokens that
the cache does not hold). `check_integrity` proves it: free pages + cached pages == all pages,
whenever no request is running.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, List, Tuple

import torch

from minisgl.core import Req
from minisgl.kvcache import BaseCacheHandle, MatchResult, create_prefix_cache
from minisgl.utils import div_ceil

if TYPE_CHECKING:
    from .utils import PendingReq


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor, type: str) -> None:
        device = page_table.device
        # one entry per free page: the slot of its first token (0, page_size, 2 * page_size, ...)
        self.free_slots = torch.arange(num_pages, dtype=torch.int32, device=device) * page_size
        self.prefix_cache = create_prefix_cache(device=device, type=type)
        self.device = device
        self.num_pages = num_pages
        self.page_table = page_table
        self.page_size = page_size

    def match_req(self, req: PendingReq) -> MatchResult:
        """The longest cached prefix of the prompt, short of its last token: that token must
        be computed, since its logits give the first output."""
        assert req.input_len > 0, "a request needs at least one prompt token"
        return self.prefix_cache.match_prefix(req.input_ids[: req.input_len - 1])

    @property
    def available_size(self) -> int:
        """Token slots a new request could get: free ones and evictable cached ones."""
        return self.prefix_cache.size_info.evictable_size + len(self.free_slots) * self.page_size

    def lock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=False)

    def unlock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=True)

    def allocate_paged(self, reqs: List[Req]) -> None:
        """Give every request the pages its next forward pass writes into (positions
        cached_len .. device_len-1), and record their slots in the page table."""
        needed_pages = 0
        allocation_info: List[Tuple[int, int, int]] = []
        for req in reqs:
            first_page = div_ceil(req.cached_len, self.page_size)  # pages it has already
            last_page = div_ceil(req.device_len, self.page_size)
            if last_page > first_page:
                needed_pages += last_page - first_page
                allocation_info.append((req.table_idx, first_page, last_page))
        if needed_pages > 0:
            allocated = self._page_to_token(self._allocate(needed_pages))
            _write_page_table(self.page_table, allocated, allocation_info, self.page_size)

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Hand the request's computed tokens (0 .. cached_len-1) to the prefix cache.

        Of the slots page_table[req, 0 .. cached_len-1]:
          [0, old handle's length)       came from the cache when the request started;
          [old handle's length, matched) the request computed, but meanwhile another request
                                         cached the same tokens: duplicates, freed now (a
                                         request that keeps running reads the cache's copy
                                         from now on: its page-table row is pointed at it);
          [matched, new handle's length) now owned by the cache;
          [new handle's length, end)     a partial last page the cache does not take: freed if
                                         the request is finished, else kept by the request.
        """
        insert_ids = req.input_ids[: req.cached_len]
        page_indices = self.page_table[req.table_idx, : req.cached_len]
        old_handle = req.cache_handle
        matched, new_handle = self.prefix_cache.insert_prefix(insert_ids, page_indices)
        self.unlock(old_handle)  # only after the insert, which may reuse the old nodes
        duplicates = page_indices[old_handle.cached_len : matched].clone()
        self._free(duplicates)
        if finished:
            self._free(page_indices[new_handle.cached_len :])
        else:
            if len(duplicates) > 0:  # the row still points at the freed pages: use the cache's
                cached = new_handle.get_matched_indices()[old_handle.cached_len : matched]
                page_indices[old_handle.cached_len : matched] = cached.to(page_indices.device)
            req.cache_handle = new_handle
            self.lock(new_handle)

    def free_uncomputed(self, req: Req) -> None:
        """Give back the pages allocated for a forward pass that did not complete: those of
        positions cached_len .. device_len-1 that allocate_paged added."""
        first_page = div_ceil(req.cached_len, self.page_size)
        last_page = div_ceil(req.device_len, self.page_size)
        if last_page > first_page:
            row = self.page_table[req.table_idx]
            self._free(row[first_page * self.page_size : last_page * self.page_size])

    def check_integrity(self) -> None:
        self.prefix_cache.check_integrity()
        cache_pages = self.prefix_cache.size_info.total_size // self.page_size
        if len(self.free_slots) + cache_pages != self.num_pages:
            raise RuntimeError(
                "CacheManager integrity check failed: "
                f"free pages ({len(self.free_slots)}) + cached pages ({cache_pages}) "
                f"!= all pages ({self.num_pages})"
            )
        if len(torch.unique(self.free_slots)) != len(self.free_slots):
            raise RuntimeError("CacheManager integrity check failed: a page is free twice")
        if self.page_size > 1 and not torch.all(self.free_slots % self.page_size == 0):
            raise RuntimeError("CacheManager integrity check failed: a free slot is mid-page")

    @contextmanager
    def lazy_free_region(self) -> Iterator[None]:
        """Collect the pages freed inside the block and return them in one concatenation."""
        pending: List[torch.Tensor] = []

        def lazy_free(indices: torch.Tensor) -> None:
            if len(indices) > 0:
                pending.append(indices[:: self.page_size])

        self._free = lazy_free  # type: ignore[method-assign]
        try:
            yield
        finally:
            del self._free
            self.free_slots = torch.cat([self.free_slots, *pending])

    def _allocate(self, needed_pages: int) -> torch.Tensor:
        free_pages = len(self.free_slots)
        if needed_pages > free_pages:
            evicted = self.prefix_cache.evict((needed_pages - free_pages) * self.page_size)
            self.free_slots = torch.cat([self.free_slots, evicted[:: self.page_size]])
            assert len(self.free_slots) >= needed_pages, "eviction did not free enough pages"
        allocated = self.free_slots[:needed_pages]
        self.free_slots = self.free_slots[needed_pages:]
        return allocated

    def _free(self, indices: torch.Tensor) -> None:
        """Give back the pages holding token slots `indices` (every page_size-th is a page)."""
        if len(indices) > 0:
            self.free_slots = torch.cat([self.free_slots, indices[:: self.page_size]])

    def _page_to_token(self, pages: torch.Tensor) -> torch.Tensor:
        """First slots of pages -> every slot of those pages, in order."""
        if self.page_size == 1:
            return pages
        offsets = torch.arange(self.page_size, device=self.device, dtype=torch.int32)
        return (pages.unsqueeze(1) + offsets).flatten()


def _write_page_table(
    page_table: torch.Tensor,
    allocated: torch.Tensor,
    allocation_info: List[Tuple[int, int, int]],
    page_size: int,
) -> None:
    """page_table[slot, first_page*page_size : last_page*page_size] = the allocated slots, for
    every (slot, first_page, last_page), in one indexed write."""
    rows: List[torch.Tensor] = []
    columns: List[torch.Tensor] = []
    for table_idx, first_page, last_page in allocation_info:
        positions = torch.arange(first_page * page_size, last_page * page_size, dtype=torch.int64)
        columns.append(positions)
        rows.append(torch.full_like(positions, table_idx))
    row_index, column_index = torch.cat(rows), torch.cat(columns)
    assert len(row_index) == len(allocated), "allocated slots and page-table entries differ"
    page_table[row_index.to(page_table.device), column_index.to(page_table.device)] = allocated
