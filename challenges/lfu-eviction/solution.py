"""The book's LFURadixCache: evict the evictable leaf that the fewest matches have passed
through, the least recently used of those first.

The counts live beside the tree, one `Usage` per node. Every node the base class creates (a new
leaf, or the head of a split) appears on the path of the call that created it, so walking that
path after each match and insert is enough to find it, and a split head takes over the usage of
the half it was cut from: every match that passed through the old node passed through both.
"""

from __future__ import annotations

import heapq
from typing import Dict, List, NamedTuple, Tuple

import torch

from minisgl.kvcache.base import BaseCacheHandle, InsertResult, MatchResult
from minisgl.kvcache.radix_cache import RadixCacheHandle, RadixPrefixCache, RadixTreeNode


class Usage(NamedTuple):
    hits: int  # match_prefix calls whose matched prefix covers the node
    last_use: int  # the latest match or insert whose path reached it (a call count)


class LFURadixCache(RadixPrefixCache):
    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.clock = 0  # counts calls: the base's timestamps can tie and miss split heads
        self.usage: Dict[RadixTreeNode, Usage] = {}

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        result = super().match_prefix(input_ids)
        self._record(result.cuda_handle, hit=True)
        return result

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        result = super().insert_prefix(input_ids, indices)
        self._record(result.handle, hit=False)
        return result

    def evict(self, size: int) -> torch.Tensor:
        if size == 0:
            return self.empty_tensor
        if size > self.evictable_size:
            raise RuntimeError(
                f"cannot evict {size} tokens: only {self.evictable_size} are evictable"
            )
        heap = [self._entry(leaf) for leaf in self._collect_leave_nodes_for_evict()]
        heapq.heapify(heap)
        evicted: List[torch.Tensor] = []
        evicted_size = 0
        while evicted_size < size:
            *_, node = heapq.heappop(heap)
            evicted_size += node.length
            evicted.append(node.value)
            self.evictable_size -= node.length
            parent = node.parent
            _detach(node)
            del self.usage[node]
            if parent.is_leaf() and parent.ref_count == 0:  # never the root: it is locked
                heapq.heappush(heap, self._entry(parent))
        return torch.cat(evicted)

    def reset(self) -> None:
        super().reset()
        self.usage.clear()

    def _entry(self, node: RadixTreeNode) -> Tuple[int, int, int, RadixTreeNode]:
        usage = self.usage[node]
        return usage.hits, usage.last_use, node.uuid, node  # uuid: nodes never get compared

    def _record(self, handle: BaseCacheHandle, hit: bool) -> None:
        """Count one use of every node on the handle's path."""
        assert isinstance(handle, RadixCacheHandle)
        self.clock += 1
        node, below = handle.node, None
        while not node.is_root():
            usage = self.usage.get(node)
            if usage is None:  # made by this call: a new leaf, or the head of a split
                cut_from = [child for child in node.children.values() if child is not below]
                usage = self.usage[cut_from[0]] if cut_from else Usage(0, 0)
            self.usage[node] = Usage(usage.hits + hit, self.clock)
            node, below = node.parent, node


def _detach(leaf: RadixTreeNode) -> None:
    """Take a leaf out of its parent's children (found by identity: keys are the node's own)."""
    children = leaf.parent.children
    del children[next(key for key, child in children.items() if child is leaf)]
