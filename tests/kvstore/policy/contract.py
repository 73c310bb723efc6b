"""``PolicyContract``: the behaviour every eviction policy promises, run against each one.

A test module subclasses it as ``TestXxxContract`` and defines :meth:`make`; the class itself
is not named ``Test*`` so pytest collects it only through those subclasses.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore.policy.base import Policy
from kvstore.types import BlockKey


def key(i: int, ns: str = "ns") -> BlockKey:
    return (ns, i.to_bytes(8, "big"))


def everything(_: BlockKey) -> bool:
    return True


def not_in(pinned: set[BlockKey]) -> Callable[[BlockKey], bool]:
    return lambda k: k not in pinned


def fill(policy: Policy, ids: range | list[int]) -> list[BlockKey]:
    keys = [key(i) for i in ids]
    for k in keys:
        policy.on_put(k, 1)
    return keys


def drain(policy: Policy, evictable: Callable[[BlockKey], bool] = everything) -> list[BlockKey]:
    """Evicts one key at a time, as a store over its watermark does, until none is evictable."""
    order: list[BlockKey] = []
    while True:
        victims = policy.victims(1, evictable)
        if not victims:
            return order
        policy.on_remove(victims[0])
        order.append(victims[0])


# One random event: (op, key id, n for victims); pinned key ids are drawn per victims call.
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "hit", "remove", "victims"]),
        st.integers(0, 15),
        st.integers(0, 6),
        st.frozensets(st.integers(0, 15), max_size=6),
    ),
    max_size=120,
)


class PolicyContract:
    def make(self) -> Policy:
        raise NotImplementedError

    def test_put_tracks_key(self) -> None:
        policy = self.make()
        assert len(policy) == 0 and key(1) not in policy
        policy.on_put(key(1), 10)
        assert key(1) in policy and len(policy) == 1
        policy.on_put(key(1), 10)  # a second put is an access, not a second key
        assert len(policy) == 1

    def test_remove_forgets_key(self) -> None:
        policy = self.make()
        fill(policy, range(3))
        policy.on_remove(key(1))
        assert key(1) not in policy and len(policy) == 2
        assert key(1) not in policy.victims(10, everything)

    def test_unknown_keys_are_ignored(self) -> None:
        policy = self.make()
        fill(policy, range(3))
        policy.on_hit(key(99))
        policy.on_remove(key(98))
        assert len(policy) == 3 and key(99) not in policy and key(98) not in policy
        assert sorted(policy.victims(10, everything)) == [key(0), key(1), key(2)]

    def test_contains_accepts_any_object(self) -> None:
        policy = self.make()
        fill(policy, range(2))
        assert "not a key" not in policy and None not in policy

    def test_victims_of_empty_policy(self) -> None:
        assert self.make().victims(4, everything) == []

    def test_victims_zero_is_empty(self) -> None:
        policy = self.make()
        fill(policy, range(4))
        assert policy.victims(0, everything) == []

    def test_victims_at_most_n_and_exactly_min(self) -> None:
        policy = self.make()
        keys = fill(policy, range(10))
        for n in (1, 3, 10, 25):
            victims = policy.victims(n, everything)
            assert len(victims) == min(n, 10)
            assert len(set(victims)) == len(victims)
            assert set(victims) <= set(keys)

    def test_victims_do_not_forget(self) -> None:
        policy = self.make()
        keys = fill(policy, range(6))
        first = policy.victims(3, everything)
        assert len(policy) == 6 and all(k in policy for k in keys)
        # Not removed, so they are still the best victims next time.
        assert policy.victims(3, everything) == first

    def test_victims_skip_pinned_without_losing_them(self) -> None:
        policy = self.make()
        keys = fill(policy, range(8))
        pinned = set(keys[:4])
        victims = policy.victims(8, lambda k: k not in pinned)
        assert sorted(victims) == sorted(keys[4:])
        assert all(k in policy for k in pinned)
        assert sorted(drain(policy, lambda k: k not in pinned)) == sorted(keys[4:])
        assert sorted(drain(policy)) == sorted(pinned)  # unpinned later: evicted then

    def test_all_pinned_gives_no_victims(self) -> None:
        policy = self.make()
        fill(policy, range(5))
        assert policy.victims(3, lambda k: False) == []
        assert len(policy) == 5

    def test_drain_evicts_every_key_once(self) -> None:
        policy = self.make()
        keys = fill(policy, range(20))
        for k in keys[::3]:
            policy.on_hit(k)
        order = drain(policy)
        assert sorted(order) == sorted(keys) and len(policy) == 0

    def test_namespaces_are_distinct_keys(self) -> None:
        policy = self.make()
        policy.on_put(key(1, "a"), 1)
        policy.on_put(key(1, "b"), 1)
        assert len(policy) == 2
        policy.on_remove(key(1, "a"))
        assert key(1, "b") in policy and key(1, "a") not in policy

    # Each subclass runs this inherited test; it keeps no state on ``self`` (make() builds a
    # fresh policy), which is what the differing-executors check guards against.
    @settings(
        max_examples=60, deadline=None, suppress_health_check=[HealthCheck.differing_executors]
    )
    @given(ops=_OPS)
    def test_random_events_keep_the_contract(
        self, ops: list[tuple[str, int, int, frozenset[int]]]
    ) -> None:
        policy = self.make()
        resident: set[BlockKey] = set()
        for op, i, n, pinned_ids in ops:
            k = key(i)
            if op == "put":
                policy.on_put(k, 1)
                resident.add(k)
            elif op == "hit":
                policy.on_hit(k)
            elif op == "remove":
                policy.on_remove(k)
                resident.discard(k)
            else:
                pinned = {key(p) for p in pinned_ids}
                victims = policy.victims(n, not_in(pinned))
                assert len(victims) == len(set(victims))
                assert set(victims) <= resident - pinned
                assert len(victims) == min(n, len(resident - pinned))
            assert len(policy) == len(resident)
            assert all(r in policy for r in resident)

    @settings(
        max_examples=40, deadline=None, suppress_health_check=[HealthCheck.differing_executors]
    )
    @given(batches=st.lists(st.tuples(st.sampled_from(["put", "hit", "remove"]),
                                      st.lists(st.integers(0, 15), max_size=8)), max_size=30))
    def test_batched_events_are_the_events_in_order(
        self, batches: list[tuple[str, list[int]]]
    ) -> None:
        """``on_put_many`` / ``on_hit_many`` / ``on_remove_many`` of a batch leave the policy
        as the per-key events of the batch do, in order (a key twice in a batch too): the
        same keys tracked, evicted in the same order."""
        one, many = self.make(), self.make()
        for op, ids in batches:
            keys = [key(i) for i in ids]
            if op == "put":
                for k in keys:
                    one.on_put(k, 1)
                many.on_put_many(keys, [1] * len(keys))
            elif op == "hit":
                for k in keys:
                    one.on_hit(k)
                many.on_hit_many(keys)
            else:
                for k in keys:
                    one.on_remove(k)
                many.on_remove_many(keys)
            assert len(one) == len(many)
        assert drain(one) == drain(many)


def simulate(policy: Policy, trace: list[BlockKey], capacity: int) -> int:
    """Runs ``trace`` through a cache of ``capacity`` keys driven by ``policy``; returns hits."""
    hits = 0
    for k in trace:
        if k in policy:
            hits += 1
            policy.on_hit(k)
            continue
        if len(policy) >= capacity:
            (victim,) = policy.victims(1, everything)
            policy.on_remove(victim)
        policy.on_put(k, 1)
    return hits
