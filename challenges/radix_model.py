"""What the two eviction checkers (lfu-eviction, cost-aware-eviction) share: a model of the
radix cache that keeps no tree, driven beside the reader's cache and compared after every step,
a random workload, and an engine run with the reader's cache plugged in.

The model keeps one record per cached page, filed under the prefix that ends with it, and the
set of prefixes where a node of the real tree ends. Every match and insert ends a node where
its walk ends, and nodes are never merged again, so that set is the tree's shape; and the pages
of one node share their hits, last use and locks, because every walk covers a node whole. A
checker subclasses PolicyModel with its policy's victim_key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, List, Set, Tuple

import pytest
import torch

from minisgl.core import Context, SamplingParams, clear_global_ctx, set_global_ctx
from minisgl.kvcache import SUPPORTED_CACHE_MANAGER, BaseCacheHandle
from minisgl.kvcache.radix_cache import RadixPrefixCache
from tools.models import ensure_model
from tools.parity import book_dtype

Key = Tuple[int, ...]  # a cached prefix: the token ids from the root to the end of a page


@dataclass
class Page:
    slots: List[int]
    hits: int = 0  # match calls whose matched prefix covers this page
    last_use: int = 0  # the latest match or insert call that reached it (calls are counted)
    locks: int = 0


class PolicyModel:
    """The eviction policy's model; a checker gives it the policy (victim_key, victim_note)."""

    def __init__(self, page_size: int) -> None:
        self.page = page_size
        self.pages: Dict[Key, Page] = {}
        self.ends: Set[Key] = set()  # where nodes end
        self.clock = 0

    def victim_key(self, start: Key, end: Key) -> Tuple:
        """The order of eviction: the leaf with the smallest key goes first."""
        raise NotImplementedError

    def victim_note(self, start: Key, end: Key) -> str:
        """What the messages say about a victim, beyond its hits."""
        return ""

    def _ends_of_pages(self, key: Key, start: int = 0) -> List[Key]:
        return [key[:k] for k in range(start + self.page, len(key) + 1, self.page)]

    def matched(self, ids: Key) -> int:
        n = 0
        while n + self.page <= len(ids) and ids[: n + self.page] in self.pages:
            n += self.page
        return n

    def slots(self, key: Key, start: int = 0) -> List[int]:
        return [slot for k in self._ends_of_pages(key, start) for slot in self.pages[k].slots]

    def _use(self, ids: Key, n: int, hit: bool) -> None:
        self.clock += 1
        for k in self._ends_of_pages(ids[:n]):
            self.pages[k].hits += hit
            self.pages[k].last_use = self.clock
        if n:
            self.ends.add(ids[:n])

    def match(self, ids: Key) -> int:
        n = self.matched(ids)
        self._use(ids, n, hit=True)
        return n

    def insert(self, ids: Key, slots: List[int]) -> int:
        n = len(ids) // self.page * self.page
        cached = self.matched(ids[:n])
        for k in self._ends_of_pages(ids[:n], cached):
            self.pages[k] = Page(slots[len(k) - self.page : len(k)])
        if cached:
            self.ends.add(ids[:cached])
        self._use(ids, n, hit=False)
        return cached

    def lock(self, key: Key, by: int) -> None:
        for k in self._ends_of_pages(key):
            self.pages[k].locks += by

    def evictable_size(self) -> int:
        return self.page * sum(1 for page in self.pages.values() if page.locks == 0)

    def protected_size(self) -> int:
        return self.page * len(self.pages) - self.evictable_size()

    def start(self, end: Key) -> Key:
        """Where the node that ends at `end` begins."""
        return max(
            (end[:k] for k in range(0, len(end), self.page) if k == 0 or end[:k] in self.ends),
            key=len,
        )

    def node_slots(self, end: Key) -> List[int]:
        return self.slots(end, len(self.start(end)))

    def tokens_by_slot(self) -> Dict[int, int]:
        return {
            slot: k[len(k) - self.page + i]
            for k, p in self.pages.items()
            for i, slot in enumerate(p.slots)
        }

    def nodes(self) -> Set[Tuple[int, ...]]:
        """Every node, as the slots it holds."""
        return {tuple(self.node_slots(end)) for end in self.ends}

    def leaves(self) -> List[Tuple[Key, Key]]:
        """(where it starts, where it ends) of every unlocked leaf node."""
        parents = {key[: -self.page] for key in self.pages}
        return [
            (self.start(end), end)
            for end in self.ends
            if end not in parents and self.pages[end].locks == 0
        ]

    def evict(self, size: int) -> Tuple[List[int], List[str]]:
        """The slots the policy gives back, and a line per evicted node for messages."""
        slots: List[int] = []
        victims: List[str] = []
        while len(slots) < size:
            start, end = min(self.leaves(), key=lambda node: self.victim_key(*node))
            page = self.pages[end]
            victims.append(
                f"{list(end[len(start) :])} (hits {page.hits}, "
                f"{self.victim_note(start, end)}last used by call {page.last_use})"
            )
            slots += self.slots(end, len(start))
            for k in self._ends_of_pages(end, len(start)):
                del self.pages[k]
                self.ends.discard(k)
        return slots, victims


def make_cache(cache_class: type, page_size: int) -> RadixPrefixCache:
    clear_global_ctx()
    set_global_ctx(Context(page_size=page_size))
    try:
        cache = cache_class(torch.device("cpu"))
    finally:
        clear_global_ctx()
    name = cache_class.__name__
    assert isinstance(cache, RadixPrefixCache), f"{name} must subclass RadixPrefixCache"
    return cache


def tree_nodes(cache: RadixPrefixCache) -> Set[Tuple[int, ...]]:
    found = set()
    stack = list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        found.add(tuple(node.value.tolist()))
        stack.extend(node.children.values())
    return found


def ids_tensor(key: Key) -> torch.Tensor:
    return torch.tensor(key, dtype=torch.int64)


class Pair:
    """Your cache and the model, driven together and compared after every step."""

    def __init__(self, cache: RadixPrefixCache, model: PolicyModel) -> None:
        self.cache, self.model = cache, model
        self.next_slot = 0
        self.locked: List[Tuple[BaseCacheHandle, Key]] = []

    def insert(self, *ids: int, lock: bool = False) -> Key:
        key = tuple(ids)
        slots = list(range(self.next_slot, self.next_slot + len(key)))
        self.next_slot += len(key)
        result = self.cache.insert_prefix(ids_tensor(key), torch.tensor(slots, dtype=torch.int32))
        cached = self.model.insert(key, slots)
        assert result.cached_len == cached, f"insert {list(key)}: cached_len"
        aligned = len(key) // self.model.page * self.model.page
        assert result.handle.cached_len == aligned, f"insert {list(key)}: the handle's length"
        if lock and aligned:
            self._lock(result.handle, key[:aligned])
        self.agree(f"after insert {list(key)}")
        return key

    def match(self, *ids: int, lock: bool = False) -> int:
        key = tuple(ids)
        handle = self.cache.match_prefix(ids_tensor(key)).cuda_handle
        n = self.model.match(key)
        assert handle.cached_len == n, f"match {list(key)}: found {handle.cached_len}, not {n}"
        assert handle.get_matched_indices().tolist() == self.model.slots(key[:n])
        if lock and n:
            self._lock(handle, key[:n])
        self.agree(f"after match {list(key)}")
        return n

    def _lock(self, handle: BaseCacheHandle, key: Key) -> None:
        self.cache.lock_handle(handle)
        self.model.lock(key, +1)
        self.locked.append((handle, key))

    def unlock(self, i: int = -1) -> None:
        handle, key = self.locked.pop(i)
        self.cache.lock_handle(handle, unlock=True)
        self.model.lock(key, -1)
        self.agree(f"after unlocking {list(key)}")

    def evict(self, size: int) -> List[int]:
        if size > self.model.evictable_size():
            with pytest.raises(RuntimeError):
                self.cache.evict(size)  # more than is evictable: refuse, like RadixPrefixCache
            self.agree(f"after refusing evict({size})")
            return []
        got = self.cache.evict(size).tolist()
        assert len(got) >= size, f"evict({size}) gave back only {len(got)} slots"
        held = {slot for _, key in self.locked for slot in self.model.slots(key)}
        assert not held & set(got), f"evict({size}) took slots {sorted(held & set(got))}, locked"
        tokens = [self.model.tokens_by_slot().get(slot) for slot in got]
        expected, victims = self.model.evict(size)
        assert got == expected, (
            f"evict({size}) gave back the slots of tokens {tokens}; the policy evicts, in this "
            f"order, {'; '.join(victims)}: slots {expected}, not {got}"
        )
        self.agree(f"after evict({size})")
        return got

    def agree(self, when: str) -> None:
        self.cache.check_integrity()
        assert tree_nodes(self.cache) == self.model.nodes(), f"the tree's nodes {when}"
        info = self.cache.size_info
        model = (self.model.evictable_size(), self.model.protected_size())
        assert (info.evictable_size, info.protected_size) == model, f"sizes {when}"


def evicts_in_order(pair: Pair, *victims: Key) -> None:
    """One evict(1) per victim, each named by where its node ends: each call must take
    exactly that leaf, whole."""
    expected = [pair.model.node_slots(v) for v in victims]
    assert [pair.evict(1) for _ in victims] == expected


def random_workload(pair: Pair, seed: int) -> None:
    """160 random calls; tokens from {0, 1, 2}, so prefixes are shared and edges split all
    the time."""
    rng = random.Random(seed)
    inserted: List[Key] = []
    for _ in range(160):
        roll = rng.random()
        if roll < 0.3 or not inserted:
            ids = [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
            inserted.append(pair.insert(*ids, lock=rng.random() < 0.15))
        elif roll < 0.7:
            base = rng.choice(inserted)
            tail = [rng.randrange(3) for _ in range(rng.randrange(3))]
            pair.match(*base[: rng.randrange(len(base) + 1)], *tail, lock=rng.random() < 0.2)
        elif roll < 0.8 and pair.locked:
            pair.unlock(rng.randrange(len(pair.locked)))
        else:  # now and then one more than is evictable, which must raise
            pair.evict(rng.randint(0, pair.model.evictable_size() + 1))


SHARED = [[(7 * i * i + 13 * n) % 40000 + 3 for i in range(n)] for n in (40, 24, 12)]
# each round: 6 prompts, most of them under the first (hot) system prompt
PROMPTS = [
    SHARED[which] + [(97 * k + 5 * j) % 40000 + 3 for j in range(2 + k % 7)]
    for k, which in enumerate([0, 0, 1, 0, 2, 0] * 3)
]


def run_engine(cache_type: str) -> Tuple[List[List[int]], object]:
    from minisgl.llm import LLM

    llm = LLM(
        str(ensure_model("tiny-qwen3")),
        dtype=book_dtype(),
        cache_type=cache_type,
        page_size=2,
        num_page_override=64,  # 128 token slots: the three rounds do not fit, so it evicts
        max_running_req=3,
    )
    try:
        outputs = []
        for start in range(0, len(PROMPTS), 6):
            results = llm.generate(PROMPTS[start : start + 6], SamplingParams(max_tokens=6))
            assert all(r["error"] is None for r in results), [r["error"] for r in results]
            outputs += [list(r["token_ids"]) for r in results]
        llm.cache_manager.check_integrity()
        return outputs, llm.cache_manager.prefix_cache
    finally:
        llm.shutdown()


def engine_gives_the_same_tokens(cache_class: type, name: str) -> None:
    """The engine on tiny Qwen3 with `cache_class` as its prefix cache, registered as `name`:
    it must evict, and give the tokens the plain radix cache gives."""
    evicted: List[int] = []

    class Counting(cache_class):
        def evict(self, size: int) -> torch.Tensor:
            slots = super().evict(size)
            evicted.append(len(slots))
            return slots

    if name not in SUPPORTED_CACHE_MANAGER.supported_names():
        SUPPORTED_CACHE_MANAGER.register(name)(Counting)
    expected, _ = run_engine("radix")
    outputs, cache = run_engine(name)
    assert isinstance(cache, Counting), "the engine did not use your cache"
    assert sum(evicted) > 0, "the workload should have made your cache evict"
    assert outputs == expected
