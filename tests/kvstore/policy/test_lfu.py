"""LFU with dynamic aging: the contract, frequency order, recency ties and aging."""

from __future__ import annotations

import pytest

from kvstore.policy.base import Policy
from kvstore.policy.lfu import LFUPolicy
from tests.kvstore.policy.contract import PolicyContract, drain, fill, key, simulate


class TestLFUContract(PolicyContract):
    def make(self) -> Policy:
        return LFUPolicy()


class TestLFUCappedContract(PolicyContract):
    def make(self) -> Policy:
        return LFUPolicy(max_freq=2)


def test_evicts_least_frequent_first_ties_by_recency() -> None:
    policy = LFUPolicy()
    keys = fill(policy, range(5))
    for _ in range(3):
        policy.on_hit(keys[0])
    policy.on_hit(keys[3])
    policy.on_hit(keys[1])
    # keys 2 and 4 have one access each (2 older); 3 and 1 two each (3 touched first).
    assert drain(policy) == [keys[2], keys[4], keys[3], keys[1], keys[0]]


def test_hot_keys_survive_a_stream_of_one_hit_keys() -> None:
    policy = LFUPolicy()
    hot = [key(i) for i in range(5)]
    trace = hot * 4
    for i in range(100, 400):
        trace += [key(i), hot[i % 5]]
    simulate(policy, trace, capacity=10)
    assert all(k in policy for k in hot)


def test_aging_lets_a_formerly_hot_key_be_evicted() -> None:
    policy = LFUPolicy()
    old = key(0)
    simulate(policy, [old] * 50, capacity=8)
    # A new working set, each key used a few times, rotates through the cache; the old key is
    # never touched again. Without aging its count of 50 would keep it resident for ever.
    evicted_after = None
    for step in range(2000):
        simulate(policy, [key(1000 + step)] * 3, capacity=8)
        if old not in policy:
            evicted_after = step
            break
    assert evicted_after is not None
    assert evicted_after > 5  # it was protected for a while: counts matter before they age


def test_stale_heap_entries_are_compacted() -> None:
    policy = LFUPolicy()
    keys = fill(policy, range(10))
    for _ in range(1000):
        for k in keys:
            policy.on_hit(k)
    assert len(policy._heap) <= 2 * len(policy) + 64


def test_rejects_bad_max_freq() -> None:
    with pytest.raises(ValueError, match="max_freq"):
        LFUPolicy(max_freq=0)
