"""Pages for requests without a cache manager (chapter 04; chapter 08 builds the real one)."""

from __future__ import annotations

from typing import Dict, List

import torch

from minisgl.core import Batch, Req


class PageAllocator:
    """Hands out whole pages and writes the page table (a preview of chapter 08's manager)."""

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor) -> None:
        self.free_pages = list(range(num_pages))
        self.page_size = page_size
        self.page_table = page_table
        self.pages: Dict[int, List[int]] = {}  # request slot -> its pages, in order

    def slots_for(self, table_idx: int, start: int, end: int) -> torch.Tensor:
        """Token slots for positions start..end-1 of a request, taking new pages as needed."""
        pages = self.pages.setdefault(table_idx, [])
        while len(pages) * self.page_size < end:
            pages.append(self.free_pages.pop(0))
        positions = torch.arange(start, end)
        page_ids = torch.tensor(pages, dtype=torch.int64)[positions // self.page_size]
        slots = (page_ids * self.page_size + positions % self.page_size).to(torch.int32)
        self.page_table[table_idx, start:end] = slots.to(self.page_table.device)
        return slots

    def release(self, table_idx: int) -> None:
        self.free_pages.extend(self.pages.pop(table_idx, []))


def prepare_batch(reqs: List[Req], phase: str, allocator: PageAllocator) -> Batch:
    """The batch's tokens (each request's extend part), their positions and their K/V slots."""
    batch = Batch(reqs=reqs, phase=phase)  # type: ignore[arg-type]
    batch.padded_reqs = reqs
    batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs])
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    batch.out_loc = torch.cat(
        [allocator.slots_for(r.table_idx, r.cached_len, r.device_len) for r in reqs]
    )
    device = allocator.page_table.device  # where the engine runs
    batch.input_ids, batch.positions = batch.input_ids.to(device), batch.positions.to(device)
    batch.out_loc = batch.out_loc.to(device)
    return batch
