"""One simulated cache: a capacity in bytes, driven by a real kvstore policy object, the way the
store drives a tier's policy (told ``on_put`` / ``on_hit`` / ``on_remove``, asked for
``victims``). The miniature simulations run one per capacity point on the sampled stream;
tests and the accuracy bench replay whole traces through it at full scale.

A read of a resident key is a hit (``on_hit``); any other read or insert makes room first,
one victim at a time as the policy names them, then puts the key (``on_put``), as every policy
here admits what it is given (demand fetch, like Belady's MIN in ``kvstore.policy.belady``).
A block larger than the whole capacity is not stored. Nothing is ever pinned.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import cast

from kvstore.policy import make_policy
from kvstore.policy.base import Policy
from kvstore.types import BlockKey


def _evictable(_: BlockKey) -> bool:
    return True


class SimCache:
    """A cache of ``capacity`` bytes ordered by the policy ``policy`` (a registered name or an
    instance). Keys are any hashable (the miniature caches use 64-bit integers): the policies
    only hash and compare them. Not thread-safe."""

    __slots__ = ("_sizes", "capacity", "policy", "used")

    def __init__(self, policy: str | Policy, capacity: int) -> None:
        self.policy: Policy = make_policy(policy) if isinstance(policy, str) else policy
        self.capacity = max(0, int(capacity))
        self.used = 0
        self._sizes: dict[Hashable, int] = {}  # resident key -> its size

    def read(self, key: Hashable, size: int) -> bool:
        """A request for ``key``: True on a hit; on a miss the key is stored."""
        k = cast(BlockKey, key)
        if key in self._sizes:
            self.policy.on_hit(k)
            return True
        self._store(k, size)
        return False

    def insert(self, key: Hashable, size: int) -> None:
        """``key`` enters the cache without a request (a demotion into a lower tier); a
        resident key counts as accessed, as ``on_put`` of a tracked key does."""
        k = cast(BlockKey, key)
        if key in self._sizes:
            self.policy.on_put(k, size)
        else:
            self._store(k, size)

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` if resident."""
        size = self._sizes.pop(key, None)
        if size is not None:
            self.used -= size
            self.policy.on_remove(cast(BlockKey, key))

    def resize(self, capacity: int) -> None:
        """Change the capacity, evicting down to it."""
        self.capacity = max(0, int(capacity))
        self._make_room(0)

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def _store(self, key: BlockKey, size: int) -> None:
        if size > self.capacity:
            return
        self._make_room(size)
        self._sizes[key] = size
        self.used += size
        self.policy.on_put(key, size)

    def _make_room(self, size: int) -> None:
        while self.used + size > self.capacity and self._sizes:
            victims = self.policy.victims(1, _evictable)
            if not victims:  # cannot happen with nothing pinned; never loop for ever
                raise RuntimeError(f"{self.policy.name} named no victim among "
                                   f"{len(self._sizes)} resident keys")
            self.remove(victims[0])


def replay(policy: str, keys: Sequence[Hashable], sizes: Sequence[int],
           capacity: int) -> list[bool]:
    """Whether each read of ``keys`` (sizes ``sizes``) hits a ``capacity``-byte cache of
    ``policy``, starting empty: the exact replay a curve is measured against."""
    cache = SimCache(policy, capacity)
    read = cache.read
    return [read(k, s) for k, s in zip(keys, sizes, strict=True)]
