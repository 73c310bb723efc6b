"""LRU: the contract, exact recency order, and a state machine against a list model."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstore.policy.base import Policy
from kvstore.policy.lru import LRUPolicy
from kvstore.types import BlockKey
from tests.kvstore.policy.contract import PolicyContract, drain, everything, fill, key, not_in


class TestLRUContract(PolicyContract):
    def make(self) -> Policy:
        return LRUPolicy()


def test_evicts_least_recently_used_first() -> None:
    policy = LRUPolicy()
    keys = fill(policy, range(5))
    policy.on_hit(keys[0])
    policy.on_put(keys[2], 1)  # re-put counts as an access
    assert drain(policy) == [keys[1], keys[3], keys[4], keys[0], keys[2]]


def test_pinned_oldest_is_skipped_and_stays_oldest() -> None:
    policy = LRUPolicy()
    keys = fill(policy, range(4))
    assert policy.victims(2, not_in({keys[0]})) == [keys[1], keys[2]]
    assert policy.victims(1, everything) == [keys[0]]


class LRUMachine(RuleBasedStateMachine):
    """The model is a list, least recently used first; victims must be its evictable prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = LRUPolicy()
        self.model: list[BlockKey] = []

    @rule(i=st.integers(0, 12))
    def put(self, i: int) -> None:
        k = key(i)
        if k in self.model:
            self.model.remove(k)
        self.model.append(k)
        self.policy.on_put(k, 1)

    @rule(i=st.integers(0, 12))
    def hit(self, i: int) -> None:
        k = key(i)
        if k in self.model:
            self.model.remove(k)
            self.model.append(k)
        self.policy.on_hit(k)

    @rule(i=st.integers(0, 12))
    def remove(self, i: int) -> None:
        k = key(i)
        if k in self.model:
            self.model.remove(k)
        self.policy.on_remove(k)

    @rule(n=st.integers(0, 8), pinned=st.frozensets(st.integers(0, 12), max_size=5))
    def victims(self, n: int, pinned: frozenset[int]) -> None:
        pinned_keys = {key(p) for p in pinned}
        expected = [k for k in self.model if k not in pinned_keys][:n]
        assert self.policy.victims(n, not_in(pinned_keys)) == expected

    @precondition(lambda self: bool(self.model))
    @rule()
    def evict_one(self) -> None:
        victim = self.policy.victims(1, everything)
        assert victim == [self.model[0]]
        self.policy.on_remove(victim[0])
        self.model.pop(0)

    @invariant()
    def same_keys(self) -> None:
        assert len(self.policy) == len(self.model)
        assert all(k in self.policy for k in self.model)


LRUMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestLRUMachine = LRUMachine.TestCase
