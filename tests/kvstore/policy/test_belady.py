"""Belady's MIN: exact on small traces (against exhaustive search) and an upper bound."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.policy.belady import belady_hits, next_use
from kvstore.policy.lfu import LFUPolicy
from kvstore.policy.lru import LRUPolicy
from kvstore.policy.s3fifo import S3FIFOPolicy
from tests.kvstore.policy.contract import key, simulate


def _optimal_hits(trace: tuple[int, ...], capacity: int) -> int:
    """Exhaustive search over every eviction choice (demand fetch): the true optimum."""

    @functools.cache
    def best(i: int, resident: frozenset[int]) -> int:
        if i == len(trace):
            return 0
        k = trace[i]
        if k in resident:
            return 1 + best(i + 1, resident)
        if len(resident) < capacity:
            return best(i + 1, resident | {k})
        return max(best(i + 1, (resident - {v}) | {k}) for v in resident)

    return best(0, frozenset())


def test_next_use() -> None:
    assert next_use("abca") == [3, 1 << 62, 1 << 62, 1 << 62]


def test_known_trace() -> None:
    # Capacity 2, "abcab": at c, MIN evicts b (used later than a), so a hits and b misses.
    assert belady_hits("abcab", 2) == 1
    assert belady_hits("abab", 2) == 2
    assert belady_hits("aaaa", 1) == 3


@settings(max_examples=150, deadline=None)
@given(trace=st.lists(st.integers(0, 4), max_size=12), capacity=st.integers(1, 3))
def test_matches_exhaustive_optimum(trace: list[int], capacity: int) -> None:
    assert belady_hits(trace, capacity) == _optimal_hits(tuple(trace), capacity)


@settings(max_examples=40, deadline=None)
@given(trace=st.lists(st.integers(0, 25), max_size=300), capacity=st.integers(1, 12))
def test_no_policy_beats_it(trace: list[int], capacity: int) -> None:
    keys = [key(i) for i in trace]
    bound = belady_hits(trace, capacity)
    for policy in (LRUPolicy(), LFUPolicy(), S3FIFOPolicy()):
        assert simulate(policy, keys, capacity) <= bound


def test_rejects_zero_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        belady_hits([1], 0)
