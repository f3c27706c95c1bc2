"""Your SizeAwareRadixCache (challenge cost-aware-eviction).
Run: python tools/challenge.py check cost-aware-eviction"""

from __future__ import annotations

import torch

from minisgl.kvcache.base import InsertResult, MatchResult
from minisgl.kvcache.radix_cache import RadixPrefixCache


class SizeAwareRadixCache(RadixPrefixCache):
    weight_cost: int = 4096  # a token's weight work, in keys of attention

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        # your bookkeeping: every node's hits and last use

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        raise NotImplementedError("match as RadixPrefixCache does; one hit and one use per node")

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        raise NotImplementedError("insert as RadixPrefixCache does; one use per node, no hit")

    def evict(self, size: int) -> torch.Tensor:
        raise NotImplementedError("unlocked leaves, lowest cost per slot first, then least recent")
