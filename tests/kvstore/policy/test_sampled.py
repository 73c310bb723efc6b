"""Sampled LRU and LFU-DA: the contract, the score table, and eviction order close to the
exact policies'."""

from __future__ import annotations

import random

import pytest

from kvstore.policy.base import Policy
from kvstore.policy.lfu import LFUPolicy
from kvstore.policy.lru import LRUPolicy
from kvstore.policy.sampled import KeyPool, SampledPolicy
from kvstore.policy.scores import ScoreTable
from tests.kvstore.policy.contract import PolicyContract, drain, fill, key, simulate


class TestSampledLRUContract(PolicyContract):
    def make(self) -> Policy:
        return SampledPolicy("lru", seed=1)


class TestSampledLFUContract(PolicyContract):
    def make(self) -> Policy:
        return SampledPolicy("lfu", seed=1)


def test_score_table_matches_a_dict_through_growth_and_deletes() -> None:
    table, model = ScoreTable(), {}
    rng = random.Random(7)
    for step in range(30_000):
        k = key(rng.randrange(8_000), ns=rng.choice("ab"))
        if rng.random() < 0.3:
            table.pop(k)
            model.pop(k, None)
        else:
            table.set(k, step + 1)
            model[k] = step + 1
    assert len(table) == len(model)
    for i in range(8_000):
        for ns in "ab":
            k = key(i, ns)
            assert table.get(k, 0) == model.get(k, 0)
            assert (k in table) == (k in model)
    assert table.nbytes() <= 16 * 4 * max(len(model), 1024)


def test_small_tiers_are_ordered_exactly() -> None:
    policy = SampledPolicy("lru", seed=3)
    keys = fill(policy, range(5))
    policy.on_hit(keys[0])
    policy.on_put(keys[2], 1)
    assert drain(policy) == [keys[1], keys[3], keys[4], keys[0], keys[2]]


def test_unknown_resident_keys_go_first() -> None:
    pool = KeyPool()
    policy = SampledPolicy("lru", seed=3)
    policy.attach(pool)
    for i in range(4):
        pool.add(key(i))  # held by the tier since before a restart: no score
    policy.on_put(key(9), 1)
    pool.add(key(9))
    policy.on_hit(key(0))
    assert set(policy.victims(3, lambda k: True)) == {key(1), key(2), key(3)}
    assert len(policy) == 5 and key(9) in policy and policy.tracked() == 2


@pytest.mark.parametrize(("rule", "exact"), [("lru", LRUPolicy), ("lfu", LFUPolicy)])
def test_hit_rate_close_to_the_exact_policy(rule: str, exact: type[Policy]) -> None:
    rng = random.Random(11)
    weights = [1 / (i + 1) ** 0.9 for i in range(5_000)]
    trace = [key(i) for i in rng.choices(range(5_000), weights=weights, k=40_000)]
    want = simulate(exact(), trace, 500)
    got = simulate(SampledPolicy(rule, seed=5), trace, 500)
    assert got >= 0.97 * want
