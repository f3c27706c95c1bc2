"""Request slots: a row of the page table and the same row of the token pool per request.

The token pool mirrors the page table: token_pool[slot, position] is the token id at that
position. A forward pass reads its input ids from it on the device, and writes the sampled
token back into it, so that the next step's inputs never make a trip through the host.
"""

from __future__ import annotations

from typing import List

import torch


class TableManager:
    def __init__(self, max_running_reqs: int, page_table: torch.Tensor) -> None:
        self._max_running_reqs = max_running_reqs
        self._free_slots: List[int] = list(range(max_running_reqs))
        self.page_table = page_table
        # zeros, not empty: padding requests (chapter 18) read token id 0 from their row
        self.token_pool = torch.zeros_like(page_table, dtype=torch.int32)

    @property
    def available_size(self) -> int:
        return len(self._free_slots)

    def allocate(self) -> int:
        return self._free_slots.pop()

    def free(self, slot: int) -> None:
        self._free_slots.append(slot)
