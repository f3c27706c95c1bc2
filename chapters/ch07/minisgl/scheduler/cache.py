"""KV pages for the scheduler's requests: allocation before a forward pass, release at the end.

This first version knows no prefix cache and does no admission control (chapter 08 adds both):
it hands out pages while there are free ones and fails loudly when there are none.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from minisgl.core import Req
from minisgl.utils import div_ceil


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor) -> None:
        device = page_table.device
        # one entry per free page: the slot of its first token (0, page_size, 2 * page_size, ...)
        self.free_slots = torch.arange(num_pages, dtype=torch.int32, device=device) * page_size
        self.device = device
        self.num_pages = num_pages
        self.page_table = page_table
        self.page_size = page_size

    @property
    def available_size(self) -> int:
        """Free token slots."""
        return len(self.free_slots) * self.page_size

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
        """Called after a prefill and when a request ends; an ended request's pages go back."""
        if finished:
            self._free(self.page_table[req.table_idx, : req.cached_len])

    def _allocate(self, needed_pages: int) -> torch.Tensor:
        if needed_pages > len(self.free_slots):
            raise RuntimeError(
                f"out of KV cache pages: {needed_pages} needed, {len(self.free_slots)} free "
                "(chapter 08 adds admission control)"
            )
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
