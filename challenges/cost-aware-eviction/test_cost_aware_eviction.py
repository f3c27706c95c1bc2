"""Checker of the cost-aware-eviction challenge.

Every workload runs on your cache and, beside it, on a model of the policy that keeps no tree:
one record per cached page, filed under the prefix that ends with it, and the set of prefixes
where a node of the real tree ends (challenges/radix_model.py, shared with the other eviction
challenge). After each step the two must agree, and an eviction must give back the model's
slots in the model's order. Then the engine runs once with your cache plugged in.
"""

from __future__ import annotations

from fractions import Fraction
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


class CostModel(PolicyModel):
    def __init__(self, page_size: int, weight_cost: int) -> None:
        super().__init__(page_size)
        self.weight_cost = weight_cost

    def cost_per_slot(self, start: Key, end: Key) -> Fraction:
        """Hits times the recomputation of the node's tokens, summed, over their number."""
        work = sum(self.weight_cost + i + 1 for i in range(len(start), len(end)))
        return self.pages[end].hits * Fraction(work, len(end) - len(start))

    def victim_key(self, start: Key, end: Key) -> Tuple[Fraction, int]:
        """The policy: the lowest cost per slot first, then the least recently used."""
        return self.cost_per_slot(start, end), self.pages[end].last_use

    def victim_note(self, start: Key, end: Key) -> str:
        return f"{float(self.cost_per_slot(start, end))} per slot, "


class Pair(radix_model.Pair):
    def __init__(self, candidate, page_size: int = 1, weight_cost: int = 2) -> None:
        cache = make_cache(candidate.SizeAwareRadixCache, page_size)
        cache.weight_cost = weight_cost
        super().__init__(cache, CostModel(page_size, weight_cost))


def test_a_shallow_leaf_goes_before_a_deep_one_with_the_same_hits(candidate) -> None:
    pair = Pair(candidate, weight_cost=2)
    s = pair.insert(*range(1, 9))
    d = pair.insert(*s, 20, 21)  # [20 21] under 8 tokens: 2 + 8 + 1.5 per slot
    q = pair.insert(30, 31)  # at the root: 2 + 0 + 1.5 per slot
    pair.match(*d)
    pair.match(*q)  # q is the more recent: LRU and LFU would evict d's leaf first
    evicts_in_order(pair, q, d, s)


def test_a_short_leaf_goes_before_a_long_one_at_the_same_depth(candidate) -> None:
    pair = Pair(candidate, weight_cost=2)
    a = pair.insert(1, 2)  # 2 + (2 + 1) / 2 per slot
    b = pair.insert(*range(3, 9))  # 2 + (6 + 1) / 2: its later tokens attend to more
    pair.match(*b)
    pair.match(*a)
    evicts_in_order(pair, a, b)


@pytest.mark.parametrize("weight_cost,first", [(0, "q"), (4, "d"), (4096, "d")])
def test_hits_multiply_the_cost(candidate, weight_cost: int, first: str) -> None:
    pair = Pair(candidate, weight_cost=weight_cost)
    s = pair.insert(*range(1, 9))
    d = pair.insert(*s, 20, 21)  # one hit: W + 9.5 per slot
    q = pair.insert(30, 31)  # three hits: 3 * (W + 1.5)
    pair.match(*d)
    for _ in range(3):
        pair.match(*q)
    evicts_in_order(pair, q if first == "q" else d)


def test_leaves_no_match_reused_cost_nothing_and_go_least_recently_used_first(candidate) -> None:
    pair = Pair(candidate, weight_cost=2)
    a = pair.insert(1, 2)
    b = pair.insert(*range(3, 11))
    c = pair.insert(11, 12)
    pair.match(*c)
    pair.insert(*a)  # a use, not a hit: a is now more recent than b
    evicts_in_order(pair, b, a, c)


def test_a_split_keeps_the_counts_and_moves_the_cost(candidate) -> None:
    pair = Pair(candidate, weight_cost=100)
    x = pair.insert(1, 2, 3, 4)
    pair.match(*x)
    u = pair.insert(10, 11, 12, 13)
    pair.match(*u)  # 100 + 2.5 per slot
    v = pair.insert(*range(20, 30))
    pair.match(*v)  # 100 + 5.5
    pair.match(1, 2, 99)  # splits x: head [1 2] 2 * (100 + 1.5); tail [3 4] 100 + 2 + 1.5
    evicts_in_order(pair, u, x, v, x[:2])


def test_one_call_follows_the_same_order_through_parents_that_become_leaves(candidate) -> None:
    pair = Pair(candidate, weight_cost=2)
    c1 = pair.insert(1, 2, 3)
    c2 = pair.insert(1, 2, 4)  # [1 2] is now a parent of [3] and [4]
    d = pair.insert(7, 8)
    pair.match(*c1)
    pair.match(*c2)
    for _ in range(3):
        pair.match(*d)
    order = [c1, c2, c1[:2], d]  # [3] and [4]: 5 per slot each; [1 2]: 7; d: 10.5
    expected = [slot for end in order for slot in pair.model.node_slots(end)]
    assert pair.evict(pair.model.evictable_size()) == expected


def test_locked_leaves_are_never_evicted(candidate) -> None:
    pair = Pair(candidate, weight_cost=2)
    cold = pair.insert(1, 2, 3)
    warm = pair.insert(4, 5)
    pair.match(*warm)
    pair.match(*cold, lock=True)  # the cheapest leaf, but a request holds it
    pair.match(*warm)
    assert pair.evict(0) == []
    pair.evict(pair.model.evictable_size() + 1)  # more than is evictable: must raise
    evicts_in_order(pair, warm)
    pair.evict(1)  # nothing is evictable: must raise
    pair.unlock()
    evicts_in_order(pair, cold)


@pytest.mark.parametrize(
    "seed,page_size,weight_cost",
    [(0, 1, 0), (1, 1, 3), (2, 1, 4096), (3, 2, 0), (4, 2, 3), (5, 2, 4096)],
)
def test_random_workloads_follow_the_policy(
    candidate, seed: int, page_size: int, weight_cost: int
) -> None:
    random_workload(Pair(candidate, page_size, weight_cost), seed)


def test_the_engine_gives_the_same_tokens_with_your_cache(candidate) -> None:
    class Light(candidate.SizeAwareRadixCache):
        weight_cost = 8  # small, so that depth and length weigh against the hits

    engine_gives_the_same_tokens(Light, f"challenge-size-aware-{id(candidate)}")
