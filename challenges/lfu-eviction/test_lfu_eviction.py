"""Checker of the lfu-eviction challenge.

Every workload runs on your cache and, beside it, on a model of the policy that keeps no tree:
one record per cached page, filed under the prefix that ends with it, and the set of prefixes
where a node of the real tree ends (challenges/radix_model.py, shared with the other eviction
challenge). After each step the two must agree, and an eviction must give back the model's
slots in the model's order. Then the engine runs once with your cache plugged in.
"""

from __future__ import annotations

from typing import Tuple

import pytest

from challenges import radix_model
from challenges.radix_model import (
    Key,
    PolicyModel,
    engine_gives_the_same_tokens,
    evicts_in_order,
    make_cache,
    random_workload,
)


class LFUModel(PolicyModel):
    def victim_key(self, start: Key, end: Key) -> Tuple[int, int]:
        """The policy: fewest hits first, then least recently used."""
        return self.pages[end].hits, self.pages[end].last_use


class Pair(radix_model.Pair):
    def __init__(self, candidate, page_size: int = 1) -> None:
        super().__init__(make_cache(candidate.LFURadixCache, page_size), LFUModel(page_size))


def test_fewest_hits_first_even_when_it_is_the_newest(candidate) -> None:
    pair = Pair(candidate)
    a = pair.insert(1, 2, 3)
    b = pair.insert(4, 5)
    pair.match(*b)
    pair.match(*a)
    pair.match(*a)
    c = pair.insert(6, 7)  # the newest, and never matched
    evicts_in_order(pair, c, b, a)  # plain LRU would take b first


def test_equal_hits_go_least_recently_used_first(candidate) -> None:
    pair = Pair(candidate)
    a = pair.insert(1, 2)
    b = pair.insert(3, 4)
    pair.match(*b)
    pair.match(*a)
    pair.match(*b, 9)  # b's second hit...
    pair.match(*a, 9)  # ...and a's, later
    evicts_in_order(pair, b, a)


def test_an_insert_is_a_use_but_not_a_hit(candidate) -> None:
    pair = Pair(candidate)
    a = pair.insert(1, 2)
    b = pair.insert(3, 4)
    pair.match(*a)
    pair.match(*b)
    pair.insert(*a)  # a is now the more recent of two leaves with one hit each
    evicts_in_order(pair, b, a)

    pair = Pair(candidate)
    a = pair.insert(1, 2)
    b = pair.insert(3, 4)
    pair.match(*a)
    pair.match(*b)
    pair.match(*b)
    pair.insert(*a)
    pair.insert(*a)  # still one hit: a goes before b's two
    evicts_in_order(pair, a, b)


def test_counts_survive_splits(candidate) -> None:
    pair = Pair(candidate)
    x = pair.insert(1, 2, 3, 4, 5, 6)
    pair.match(*x)
    pair.match(*x)
    y = pair.insert(7, 8)
    pair.match(*y)
    z = pair.insert(9, 10)
    pair.match(*z)
    pair.match(*z)
    pair.match(1, 2, 3, 99)  # splits x: head [1 2 3] has 3 hits now, tail [4 5 6] keeps 2
    # y (1 hit), then the tail [4 5 6] (2 hits, older than z's), z (2), and the head (3)
    evicts_in_order(pair, y, x, z, x[:3])


def test_one_call_follows_the_same_order_through_parents_that_become_leaves(candidate) -> None:
    pair = Pair(candidate)
    c1 = pair.insert(1, 2, 3)
    c2 = pair.insert(1, 2, 4)  # [1 2] is now a parent of [3] and [4]
    d = pair.insert(7, 8)
    pair.match(*c1)
    pair.match(*c2)
    for _ in range(3):
        pair.match(*d)
    order = [c1, c2, c1[:2], d]  # [1 2] has two hits: it goes before d's three
    expected = [slot for end in order for slot in pair.model.node_slots(end)]
    assert pair.evict(pair.model.evictable_size()) == expected


def test_a_split_head_is_used_by_the_match_that_made_it(candidate) -> None:
    pair = Pair(candidate)
    x = pair.insert(1, 2, 3, 4)
    pair.match(*x)
    w = pair.insert(5, 6)
    pair.match(*w)
    pair.match(*w)
    pair.match(1, 2, 9)  # head [1 2]: 2 hits, used now (after w); tail [3 4]: 1 hit
    evicts_in_order(pair, x, w, x[:2])


def test_locked_leaves_are_never_evicted(candidate) -> None:
    pair = Pair(candidate)
    cold = pair.insert(1, 2, 3)
    warm = pair.insert(4, 5)
    pair.match(*warm)
    pair.match(*cold, lock=True)  # cold has a hit too now, and a request holds it
    pair.match(*warm)
    assert pair.evict(0) == []
    pair.evict(pair.model.evictable_size() + 1)  # more than is evictable: must raise
    evicts_in_order(pair, warm)
    pair.evict(1)  # nothing is evictable: must raise
    pair.unlock()
    evicts_in_order(pair, cold)


@pytest.mark.parametrize("seed,page_size", [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2), (5, 2)])
def test_random_workloads_follow_the_policy(candidate, seed: int, page_size: int) -> None:
    random_workload(Pair(candidate, page_size), seed)


def test_the_engine_gives_the_same_tokens_with_your_cache(candidate) -> None:
    engine_gives_the_same_tokens(candidate.LFURadixCache, f"challenge-lfu-{id(candidate)}")
