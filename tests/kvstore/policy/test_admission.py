"""Admission rules: AlwaysAdmit, and SeenTwice with its bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.policy import ADMISSIONS, make_admission
from kvstore.policy.admission import AlwaysAdmit, SeenTwice
from kvstore.policy.base import Admission
from tests.kvstore.policy.contract import key


def test_always_admits_even_unseen_keys() -> None:
    rule = AlwaysAdmit()
    assert rule.admit(key(1))
    rule.on_access(key(1))
    rule.forget(key(1))
    assert rule.admit(key(1))


def test_seen_twice_needs_two_accesses() -> None:
    rule = SeenTwice()
    assert not rule.admit(key(1))
    rule.on_access(key(1))
    assert not rule.admit(key(1))
    rule.on_access(key(1))
    assert rule.admit(key(1))
    assert not rule.admit(key(2))


def test_seen_twice_forget_resets() -> None:
    rule = SeenTwice()
    rule.on_access(key(1))
    rule.on_access(key(1))
    rule.forget(key(1))
    rule.forget(key(99))  # unknown: ignored
    assert not rule.admit(key(1))
    rule.on_access(key(1))
    assert not rule.admit(key(1))


def test_seen_twice_window_drops_least_recent() -> None:
    rule = SeenTwice(max_keys=3)
    rule.on_access(key(0))
    for i in (1, 2, 3):  # pushes key 0 out of the window
        rule.on_access(key(i))
    rule.on_access(key(0))
    assert not rule.admit(key(0))
    # An admitted key that keeps being used stays admitted while others come and go.
    rule.on_access(key(0))
    for i in range(10, 20):
        rule.on_access(key(i))
        rule.on_access(key(0))
        assert rule.admit(key(0))


@settings(max_examples=50, deadline=None)
@given(ids=st.lists(st.integers(0, 30), max_size=200), bound=st.integers(1, 8))
def test_seen_twice_is_bounded_and_exact_within_window(ids: list[int], bound: int) -> None:
    rule = SeenTwice(max_keys=bound)
    for n, i in enumerate(ids):
        rule.on_access(key(i))
        assert len(rule) <= bound
        for j in set(ids):
            assert rule.admit(key(j)) == _seen_twice_since_drop(ids[: n + 1], j, bound)


def _seen_twice_since_drop(history: list[int], j: int, bound: int) -> bool:
    """Reference: replay an LRU window of ``bound`` keys and count j's accesses since entry."""
    window: list[int] = []
    count = 0
    for i in history:
        if i in window:
            window.remove(i)
        elif len(window) == bound:
            dropped = window.pop(0)
            if dropped == j:
                count = 0
        if i == j:
            count += 1
        window.append(i)
    return j in window and count >= 2


def test_rejects_bad_bound() -> None:
    with pytest.raises(ValueError, match="max_keys"):
        SeenTwice(max_keys=0)


@pytest.mark.parametrize("name", ADMISSIONS.names())
def test_registry_builds_every_rule_without_arguments(name: str) -> None:
    rule = make_admission(name)
    assert isinstance(rule, Admission) and rule.name == name


@pytest.mark.parametrize("name", ADMISSIONS.names())
def test_batched_accesses_and_admits_are_the_per_key_ones(name: str) -> None:
    one, many = make_admission(name), make_admission(name)
    batches = [[key(i % 7) for i in range(start, start + 5)] for start in range(0, 30, 3)]
    for batch in batches:
        for k in batch:
            one.on_access(k)
        many.on_access_many(batch)
        probe = [key(i) for i in range(9)]
        assert many.admit_many(probe) == [one.admit(k) for k in probe]
