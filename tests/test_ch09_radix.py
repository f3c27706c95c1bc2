"""Chapter 09: the radix cache. Unit tests of match, insert, split, lock and LRU eviction; a
property-based test against a simple model of what the cache should hold; and the reuse
measured through the scheduler."""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from examples.helpers import scripted
from minisgl.core import Context, clear_global_ctx, set_global_ctx
from minisgl.kvcache import create_prefix_cache
from minisgl.kvcache.radix_cache import RadixCacheHandle, RadixPrefixCache
from tests.support import load_example


def make_cache(page_size: int) -> RadixPrefixCache:
    clear_global_ctx()
    set_global_ctx(Context(page_size=page_size))
    try:
        cache = create_prefix_cache(torch.device("cpu"), "radix")
    finally:
        clear_global_ctx()
    assert isinstance(cache, RadixPrefixCache)
    return cache


def t(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def slots(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int32)


def test_insert_match_and_split() -> None:
    cache = make_cache(1)
    assert cache.insert_prefix(t(1, 2, 3, 4), slots(100, 4)).cached_len == 0
    handle = cache.match_prefix(t(1, 2, 9)).cuda_handle
    assert handle.cached_len == 2 and handle.get_matched_indices().tolist() == [100, 101]
    # the match split the edge [1 2 3 4] into [1 2] -> [3 4]
    (top,) = cache.root_node.children.values()
    assert top.length == 2 and [c.length for c in top.children.values()] == [2]
    # inserting a sibling: only the new part is taken over
    result = cache.insert_prefix(t(1, 2, 7, 8, 9), slots(200, 5))
    assert result.cached_len == 2 and result.handle.cached_len == 5
    assert result.handle.get_matched_indices().tolist() == [100, 101, 202, 203, 204]
    assert cache.size_info == (7, 0)
    cache.check_integrity()


def test_page_aligned_matching() -> None:
    cache = make_cache(4)
    cache.insert_prefix(t(*range(10)), slots(0, 10))  # only 8 tokens: two whole pages
    assert cache.size_info.total_size == 8
    assert cache.match_prefix(t(*range(7))).cuda_handle.cached_len == 4  # 7 -> one page
    assert (
        cache.match_prefix(t(0, 1, 2, 3, 4, 5, 9, 9)).cuda_handle.cached_len == 4
    )  # differs mid-page
    assert cache.match_prefix(t(*range(12))).cuda_handle.cached_len == 8
    assert cache.match_prefix(t(0, 1, 2)).cuda_handle.cached_len == 0  # less than a page
    cache.check_integrity()


def test_locking_protects_and_eviction_is_lru() -> None:
    cache = make_cache(1)
    cache.insert_prefix(t(1, 2, 3), slots(10, 3))
    cache.insert_prefix(t(5, 6), slots(20, 2))
    cache.insert_prefix(t(7, 8), slots(30, 2))
    cache.match_prefix(t(1, 2, 3))  # [1 2 3] is now the most recently used
    held = cache.match_prefix(t(5, 6)).cuda_handle
    cache.lock_handle(held)
    assert cache.size_info == (5, 2)
    assert sorted(cache.evict(1).tolist()) == [30, 31]  # the oldest unlocked leaf, whole
    with pytest.raises(RuntimeError, match="only 3 are evictable"):
        cache.evict(4)
    assert sorted(cache.evict(3).tolist()) == [10, 11, 12]
    assert cache.match_prefix(t(5, 6)).cuda_handle.cached_len == 2  # the locked one survived
    cache.lock_handle(held, unlock=True)
    assert cache.size_info == (2, 0)
    with pytest.raises(AssertionError, match="unlocked more often than locked"):
        cache.lock_handle(held, unlock=True)


def test_eviction_climbs_to_parents_that_become_leaves() -> None:
    cache = make_cache(1)
    cache.insert_prefix(t(1, 2, 3, 4), slots(0, 4))
    cache.insert_prefix(t(1, 2, 5, 6), slots(10, 4))  # splits: [1 2] -> {[3 4], [5 6]}
    evicted = cache.evict(6)
    assert sorted(evicted.tolist()) == [0, 1, 2, 3, 12, 13]
    assert cache.size_info.total_size == 0 and not cache.root_node.children


def test_integrity_check_catches_a_wrong_count() -> None:
    cache = make_cache(1)
    cache.insert_prefix(t(1, 2, 3), slots(0, 3))
    cache.evictable_size += 1
    with pytest.raises(RuntimeError, match="sizes are off"):
        cache.check_integrity()


class RadixAgainstModel(RuleBasedStateMachine):
    """Random inserts, matches, locks, unlocks and evictions, compared after every step with
    a plain model of the cache: a dict from every cached page-aligned prefix (a tuple of
    tokens) to the slots of its last page. Tokens come from a tiny alphabet, so prefixes are
    shared and edges split all the time; pages hold 2 tokens."""

    sequences = Bundle("sequences")  # what was inserted: later matches start from these

    def __init__(self) -> None:
        super().__init__()
        self.page_size = 2
        self.cache = make_cache(self.page_size)
        self.model: Dict[Tuple[int, ...], List[int]] = {}
        self.locked: List[Tuple[RadixCacheHandle, Tuple[int, ...]]] = []
        self.next_slot = 0

    def _model_match(self, ids: Tuple[int, ...]) -> int:
        n = 0
        while n + self.page_size <= len(ids) and ids[: n + self.page_size] in self.model:
            n += self.page_size
        return n

    def _pages(self, key: Tuple[int, ...]) -> List[Tuple[int, ...]]:
        return [key[:end] for end in range(self.page_size, len(key) + 1, self.page_size)]

    @rule(target=sequences, ids=st.lists(st.integers(0, 1), min_size=0, max_size=8))
    def insert(self, ids: List[int]) -> List[int]:
        key = tuple(ids)
        new = torch.arange(self.next_slot, self.next_slot + len(ids), dtype=torch.int32)
        self.next_slot += len(ids)
        expected_matched = self._model_match(key)
        result = self.cache.insert_prefix(torch.tensor(ids, dtype=torch.int64), new)
        assert result.cached_len == expected_matched
        aligned = len(ids) // self.page_size * self.page_size
        assert result.handle.cached_len == aligned
        for prefix in self._pages(key)[expected_matched // self.page_size :]:
            self.model[prefix] = new[len(prefix) - self.page_size : len(prefix)].tolist()
        return ids

    @rule(
        base=sequences,
        cut=st.integers(0, 8),
        tail=st.lists(st.integers(0, 1), max_size=4),
        lock=st.booleans(),
    )
    def match(self, base: List[int], cut: int, tail: List[int], lock: bool) -> None:
        ids = base[:cut] + tail  # often a partial match of something cached: edges split
        key = tuple(ids)
        handle = self.cache.match_prefix(torch.tensor(ids, dtype=torch.int64)).cuda_handle
        n = self._model_match(key)
        assert handle.cached_len == n
        if n:
            expected = [s for prefix in self._pages(key[:n]) for s in self.model[prefix]]
            assert handle.get_matched_indices().tolist() == expected
            if lock:
                self.cache.lock_handle(handle)
                self.locked.append((handle, key[:n]))

    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def unlock(self, data) -> None:
        i = data.draw(st.integers(0, len(self.locked) - 1))
        handle, _ = self.locked.pop(i)
        self.cache.lock_handle(handle, unlock=True)

    @rule(fraction=st.floats(0.0, 1.0))
    def evict(self, fraction: float) -> None:
        evictable = self.cache.size_info.evictable_size
        size = int(evictable * fraction)
        before = self.cache.size_info.total_size
        evicted = self.cache.evict(size)
        assert len(evicted) >= size and self.cache.size_info.total_size == before - len(evicted)
        gone = set(evicted.tolist())
        self.model = {k: v for k, v in self.model.items() if not gone & set(v)}
        for _, key in self.locked:  # nothing a request holds was evicted
            assert all(prefix in self.model for prefix in self._pages(key))

    @invariant()
    def consistent(self) -> None:
        self.cache.check_integrity()
        assert self.cache.size_info.total_size == len(self.model) * self.page_size
        protected = {prefix for _, key in self.locked for prefix in self._pages(key)}
        assert self.cache.size_info.protected_size == len(protected) * self.page_size


RadixAgainstModel.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
test_radix_cache_against_a_model = RadixAgainstModel.TestCase


def test_reuse_through_the_scheduler(model_path) -> None:
    """Two requests with one long common prefix: the second computes only its own part, and
    both produce transformers' tokens."""
    ch09 = load_example("examples/ch09_radix.py")
    common = list(range(1000, 1040))
    prompts = [common + [5, 6, 7], common + [8, 9]]
    counts = {}
    outputs = {}
    for cache_type in ("naive", "radix"):
        arrivals = [
            (0, scripted.user_msg(0, prompts[0], 6)),
            (3, scripted.user_msg(1, prompts[1], 6)),
        ]
        config = scripted.make_config("tiny-qwen2", cache_type=cache_type, page_size=4)
        sched = ch09.CountingScheduler(config, arrivals)
        outputs[cache_type] = sched.run()
        sched.cache_manager.check_integrity()
        counts[cache_type] = sched.computed
        sched.shutdown()
    assert counts == {"naive": 43 + 42, "radix": 43 + 2}  # 40 of the second prompt reused
    model = load_example("examples/ch00_step0.py").Step0Model(model_path("tiny-qwen2"))
    assert [outputs["radix"][i] for i in range(2)] == [model.generate(p, 6) for p in prompts]
    assert outputs["radix"] == outputs["naive"]


def test_a_running_request_does_not_read_pages_freed_as_duplicates(model_path) -> None:
    """Two requests with a common prefix are prefilled in the same batch. Both computed the
    prefix; the cache keeps the first one's copy, and the second one's duplicate pages are
    freed while it keeps decoding. Its page-table row must then point at the cache's copy:
    otherwise its later steps read pages that a newcomer (r2) has meanwhile overwritten."""
    shared = list(range(100, 108))
    a, b, c = shared + [900, 901], shared + [700, 701], list(range(300, 333))
    arrivals = [
        (0, scripted.user_msg(0, a, 2)),
        (0, scripted.user_msg(1, b, 20)),
        (3, scripted.user_msg(2, c, 1)),
    ]
    config = scripted.make_config(
        "tiny-qwen3", page_size=1, num_page_override=64, cache_type="radix", max_running_req=4
    )
    sched = scripted.ScriptedScheduler(config, arrivals)
    try:
        outputs = sched.run()
        sched.cache_manager.check_integrity()
    finally:
        sched.shutdown()
    model = load_example("examples/ch00_step0.py").Step0Model(model_path("tiny-qwen3"))
    assert outputs[1] == model.generate(b, 20)


def test_reset_only_once_everything_is_evicted() -> None:
    cache = make_cache(1)
    cache.insert_prefix(t(1, 2, 3), slots(0, 3))
    with pytest.raises(RuntimeError, match="3 must be evicted first"):
        cache.reset()
    assert sorted(cache.evict(cache.size_info.evictable_size).tolist()) == [0, 1, 2]
    cache.reset()
    assert cache.match_prefix(t(1, 2, 3)).cuda_handle.cached_len == 0
