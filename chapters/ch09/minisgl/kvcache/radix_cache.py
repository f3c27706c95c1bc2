"""The radix cache: a tree of token sequences whose K/V stay in the pool for reuse.

Every edge holds a run of tokens and the slots of their K/V. A path from the root spells a
cached prefix. A new request walks down with its prompt and reuses whatever it finds; after
its prefill it inserts its prompt, creating a branch where it differs from what is cached.

Reference counts protect what running requests use: locking a handle increments every node
on its path. Nodes with count 0 are "evictable"; when memory runs short, the least recently
used evictable leaves go first. With pages of several tokens, everything is page-aligned: a
node's length is a multiple of the page size and only whole pages are matched or inserted.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple, TypeAlias

import torch

from minisgl.core import get_global_ctx
from minisgl.utils import align_down

from .base import BaseCacheHandle, BasePrefixCache, InsertResult, MatchResult, SizeInfo

KEY_FN: TypeAlias = Callable[[torch.Tensor], Any]


def _compare_key(key: torch.Tensor, input_ids: torch.Tensor) -> int:
    """Length of the common prefix of two 1-D CPU tensors."""
    n = min(len(key), len(input_ids))
    differ = (key[:n] != input_ids[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


class RadixTreeNode:
    counter: int = 0  # gives every node a unique id (for debugging and tests)

    def __init__(self, key_fn: KEY_FN, tic: int | None = None) -> None:
        self.key_fn = key_fn
        self.children: Dict[Any, RadixTreeNode] = {}  # first page of the child's key -> child
        self._parent: RadixTreeNode | None = None
        self.ref_count: int = 0  # running requests whose prefix passes through this node
        self.uuid = RadixTreeNode.counter
        RadixTreeNode.counter += 1
        self.timestamp = tic or time.monotonic_ns()  # last use, for LRU eviction
        self._key: torch.Tensor  # token ids on the edge into this node
        self._value: torch.Tensor  # their KV slots
        self._length: int

    def set_key_value(self, key: torch.Tensor, value: torch.Tensor) -> None:
        assert len(key) == len(value)
        self._key, self._value, self._length = key, value, len(key)

    def set_parent(self, parent: RadixTreeNode) -> None:
        self._parent = parent
        parent.children[self.key_fn(self._key)] = self

    @property
    def length(self) -> int:
        return self._length

    @property
    def parent(self) -> RadixTreeNode:
        assert self._parent is not None, "the root has no parent"
        return self._parent

    @property
    def value(self) -> torch.Tensor:
        return self._value

    def is_root(self) -> bool:
        return self._parent is None

    def is_leaf(self) -> bool:
        return len(self.children) == 0

    def get_match_len(self, input_ids: torch.Tensor) -> int:
        return _compare_key(self._key, input_ids)

    def split_at(self, pos: int) -> RadixTreeNode:
        """Cut this node's edge after `pos` tokens: a new node takes the first part and
        becomes this node's parent. Returns the new node."""
        assert 0 < pos < self.length
        parent = self.parent
        head = RadixTreeNode(self.key_fn, self.timestamp)
        head.set_key_value(self._key[:pos], self._value[:pos])
        head.set_parent(parent)  # replaces this node among the parent's children
        head.ref_count = self.ref_count  # whoever uses this node uses its first part too
        self.set_key_value(self._key[pos:], self._value[pos:])
        self.set_parent(head)
        return head

    def __lt__(self, other: RadixTreeNode) -> bool:  # the heap of eviction: oldest first
        return self.timestamp < other.timestamp


@dataclass(frozen=True)
class RadixCacheHandle(BaseCacheHandle):
    node: RadixTreeNode  # the last node of the matched prefix

    def get_matched_indices(self) -> torch.Tensor:
        values: List[torch.Tensor] = []
        node = self.node
        while not node.is_root():
            values.append(node.value)
            node = node.parent
        values.reverse()
        if not values:
            return torch.empty(0, dtype=torch.int32)
        return torch.cat(values)


class RadixPrefixCache(BasePrefixCache):
    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.page_size = get_global_ctx().page_size
        self.key_fn = _get_key_fn(self.page_size)
        self.empty_tensor = torch.empty(0, dtype=torch.int32, device=device)
        self.evictable_size = 0
        self.protected_size = 0
        self.root_node = RadixTreeNode(self.key_fn)
        self.root_node.ref_count = 1  # the root is never evicted

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        assert isinstance(handle, RadixCacheHandle)
        node = handle.node
        while not node.is_root():
            if unlock:
                node.ref_count -= 1
                assert node.ref_count >= 0, "unlocked more often than locked"
                if node.ref_count == 0:
                    self.evictable_size += node.length
                    self.protected_size -= node.length
            else:
                if node.ref_count == 0:
                    self.evictable_size -= node.length
                    self.protected_size += node.length
                node.ref_count += 1
            node = node.parent

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        node, prefix_len = self._tree_walk(input_ids)
        return MatchResult(RadixCacheHandle(prefix_len, node))

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        insert_len = align_down(len(input_ids), self.page_size)  # whole pages only
        input_ids, indices = input_ids[:insert_len], indices[:insert_len]
        node, prefix_len = self._tree_walk(input_ids)
        if prefix_len < insert_len:  # a new leaf for the part the cache did not have
            leaf = RadixTreeNode(self.key_fn)
            leaf.set_key_value(input_ids[prefix_len:], indices[prefix_len:].clone())
            leaf.set_parent(node)
            self.evictable_size += leaf.length
            node = leaf
        return InsertResult(prefix_len, RadixCacheHandle(insert_len, node))

    def evict(self, size: int) -> torch.Tensor:
        if size == 0:
            return self.empty_tensor
        if size > self.evictable_size:
            raise RuntimeError(
                f"cannot evict {size} tokens: only {self.evictable_size} are evictable"
            )
        leaves = self._collect_leave_nodes_for_evict()
        heapq.heapify(leaves)
        evicted: List[torch.Tensor] = []
        evicted_size = 0
        while evicted_size < size:
            assert leaves, f"evicted only {evicted_size} of {size} tokens"
            node = heapq.heappop(leaves)
            assert node.ref_count == 0 and node.is_leaf() and not node.is_root()
            evicted_size += node.length
            evicted.append(node.value)
            self.evictable_size -= node.length
            parent = node.parent
            del parent.children[self.key_fn(node._key)]
            if parent.is_leaf() and parent.ref_count == 0:  # never the root: it is locked
                heapq.heappush(leaves, parent)
        return torch.cat(evicted)

    def reset(self) -> None:
        """Start from an empty tree. The cached tokens' slots must have been taken back first
        (evict(size_info.evictable_size)): a reset cannot hand them to the caller."""
        if self.protected_size or self.evictable_size:
            raise RuntimeError(
                f"cannot reset: {self.protected_size} tokens are held by requests and "
                f"{self.evictable_size} must be evicted first (their slots go back to the pool)"
            )
        self.root_node.children.clear()

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=self.evictable_size, protected_size=self.protected_size)

    def check_integrity(self) -> None:
        """Walk the tree: counts never below zero, parents at least as used as their
        children, the sizes add up, keys page-aligned and filed under their first page."""
        evictable = protected = 0
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.ref_count < 0:
                raise RuntimeError(f"radix node {node.uuid} has a negative reference count")
            if not node.parent.is_root() and node.parent.ref_count < node.ref_count:
                raise RuntimeError(f"radix node {node.uuid} is locked more than its parent")
            if node.length == 0 or node.length % self.page_size:
                raise RuntimeError(f"radix node {node.uuid} has length {node.length}")
            if node.parent.children.get(self.key_fn(node._key)) is not node:
                raise RuntimeError(f"radix node {node.uuid} is filed under the wrong key")
            if node.ref_count == 0:
                evictable += node.length
            else:
                protected += node.length
            stack.extend(node.children.values())
        if (evictable, protected) != (self.evictable_size, self.protected_size):
            raise RuntimeError(
                f"radix cache sizes are off: counted {evictable} evictable and {protected} "
                f"protected, recorded {self.evictable_size} and {self.protected_size}"
            )

    def _collect_leave_nodes_for_evict(self) -> List[RadixTreeNode]:
        leaves: List[RadixTreeNode] = []
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            if node.is_leaf():
                if node.ref_count == 0:
                    leaves.append(node)
            else:
                stack.extend(node.children.values())
        return leaves

    def _tree_walk(self, input_ids: torch.Tensor) -> Tuple[RadixTreeNode, int]:
        """Follow input_ids down the tree as far as whole pages match. A partly matched node
        is split, so that the returned node ends exactly at the match."""
        prefix_len, total = 0, len(input_ids)
        node = self.root_node
        now = time.monotonic_ns()
        while prefix_len + self.page_size <= total:
            child = node.children.get(self.key_fn(input_ids[prefix_len:]))
            if child is None:
                break
            node = child
            # the first page matched (it is the child's key), so match_len >= page_size
            match_len = align_down(node.get_match_len(input_ids[prefix_len:]), self.page_size)
            prefix_len += match_len
            if match_len != node.length:
                node = node.split_at(match_len)
                break
            node.timestamp = now  # recently used: evicted last
        return node, prefix_len


def _get_key_fn(page_size: int) -> KEY_FN:
    """A child is found by the first page of its key."""
    if page_size == 1:
        return lambda x: int(x[0].item())
    return lambda x: tuple(x[:page_size].tolist())
