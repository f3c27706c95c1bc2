"""The book's SizeAwareRadixCache: evict the unlocked leaf whose loss costs the least
recomputation per slot it frees.

Recomputing the token at position i (i tokens before it) costs `weight_cost + i + 1`: the
weights, the same for every token, and one unit per key it attends to, itself included. A leaf
of L tokens under P cached ones therefore costs `L * (weight_cost + P) + L * (L + 1) / 2`, or
`weight_cost + P + (L + 1) / 2` per slot, and it is worth that once per hit it has had. Leaves
no match has ever reused cost nothing; among equal costs the least recently used goes first.

Hits and uses are counted as in the LFU challenge: one `Usage` per node, recorded along the path
of every match and insert, a split head taking over the usage of the half it was cut from.
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


class SizeAwareRadixCache(RadixPrefixCache):
    weight_cost: int = 4096  # a token's weight work, in keys of attention (Qwen3-0.6B: ~3800)

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

    def cost_per_slot(self, node: RadixTreeNode) -> float:
        """What evicting the node is expected to cost, per slot it frees."""
        depth, above = 0, node.parent
        while not above.is_root():
            depth += above.length
            above = above.parent
        # a multiple of 1/2, so exact in a float: equal costs compare equal
        return self.usage[node].hits * (self.weight_cost + depth + (node.length + 1) / 2)

    def _entry(self, node: RadixTreeNode) -> Tuple[float, int, int, RadixTreeNode]:
        # uuid: nodes never get compared
        return self.cost_per_slot(node), self.usage[node].last_use, node.uuid, node

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
