"""S3-FIFO: the contract, one-hit wonders first, ghost re-entry, scan resistance, sizing."""

from __future__ import annotations

import pytest

from kvstore.policy.base import Policy
from kvstore.policy.lru import LRUPolicy
from kvstore.policy.s3fifo import S3FIFOPolicy
from tests.kvstore.policy.contract import (
    PolicyContract,
    drain,
    everything,
    fill,
    key,
    not_in,
    simulate,
)


class TestS3FIFOContract(PolicyContract):
    def make(self) -> Policy:
        return S3FIFOPolicy()


class TestS3FIFOHintedContract(PolicyContract):
    def make(self) -> Policy:
        return S3FIFOPolicy(capacity_hint=4)


def test_one_hit_wonders_are_evicted_before_reaccessed_keys() -> None:
    policy = S3FIFOPolicy()
    keys = fill(policy, range(10))
    for k in keys[:5]:
        policy.on_hit(k)
    assert policy.victims(5, everything) == keys[5:]
    # The re-accessed keys were moved to main, not lost.
    assert all(k in policy for k in keys)


def test_reaccessed_key_outlives_newer_one_hit_keys() -> None:
    policy = S3FIFOPolicy()
    keys = fill(policy, range(20))
    policy.on_hit(keys[0])  # oldest, but used twice
    assert drain(policy)[-1] == keys[0]


def test_ghost_key_returns_to_main() -> None:
    policy = S3FIFOPolicy()
    simulate(policy, [key(i) for i in range(20)], capacity=10)
    returning = key(9)  # the last evicted from small without a hit: still a ghost
    assert returning not in policy and policy.ghost_size > 0
    simulate(policy, [returning], capacity=10)
    # In main it outlives a flood of new keys that only pass through small.
    simulate(policy, [key(i) for i in range(100, 140)], capacity=10)
    assert returning in policy


def test_scan_does_not_flush_hot_working_set() -> None:
    hot = [key(i) for i in range(20)]
    warmup = hot * 5
    scan = [key(i) for i in range(1000, 3000)]
    s3fifo, lru = S3FIFOPolicy(), LRUPolicy()
    for policy in (s3fifo, lru):
        simulate(policy, warmup + scan, capacity=100)
    assert all(k in s3fifo for k in hot)
    assert not any(k in lru for k in hot)  # the scenario is a real scan: LRU loses them all


def test_scan_interleaved_with_hot_traffic_keeps_hits() -> None:
    hot = [key(i) for i in range(30)]
    trace = hot * 3
    for i in range(3000):
        trace += [key(10_000 + i), key(20_000 + i), hot[i % 30]]
    s3fifo_hits = simulate(S3FIFOPolicy(), trace, capacity=50)
    lru_hits = simulate(LRUPolicy(), trace, capacity=50)
    assert s3fifo_hits > 0.9 * 3000 > lru_hits


def test_pinned_keys_in_small_keep_their_place() -> None:
    policy = S3FIFOPolicy()
    keys = fill(policy, range(10))
    pinned = set(keys[:3])
    assert policy.victims(2, not_in(pinned)) == keys[3:5]
    assert policy.victims(2, everything) == keys[:2]


def test_main_reinsertion_decrements_counts() -> None:
    policy = S3FIFOPolicy(capacity_hint=100)  # small target 10: with 4 keys, evict from main
    keys = fill(policy, range(4))
    for k in keys:
        policy.on_hit(k)
    # Each small key has a hit, so each moves to main (count cleared) and is named from there.
    assert policy.victims(4, everything) == keys
    policy.on_hit(keys[0])
    policy.on_hit(keys[0])
    policy.on_hit(keys[1])
    # Main is FIFO with reinsertion: keys[0] and keys[1] go round once per hit they have left.
    assert policy.victims(4, everything) == [keys[2], keys[3], keys[1], keys[0]]


def test_ghost_is_bounded() -> None:
    policy = S3FIFOPolicy(ghost_ratio=0.5)
    simulate(policy, [key(i) for i in range(5000)], capacity=40)
    assert 0 < policy.ghost_size <= 20
    hinted = S3FIFOPolicy(capacity_hint=40, ghost_ratio=0.9)
    simulate(hinted, [key(i) for i in range(5000)], capacity=40)
    assert hinted.ghost_size == 36


@pytest.mark.parametrize(
    "kwargs",
    [{"small_ratio": 0.0}, {"small_ratio": 1.0}, {"ghost_ratio": -1}, {"capacity_hint": 0}],
)
def test_rejects_bad_tunables(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        S3FIFOPolicy(**kwargs)  # type: ignore[arg-type]
