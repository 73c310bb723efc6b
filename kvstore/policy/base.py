"""Eviction policies and admission rules.

Policies are told about events and asked for victims; they never touch bytes (cachetools'
split of accounting and ``popitem``). One policy instance serves one tier. The store holds
its lock while it calls a policy, so policies need no locking of their own.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Protocol

from kvstore.types import BlockKey


class Policy(ABC):
    """Tracks the keys resident in one tier and orders them for eviction."""

    name: str = "policy"

    @abstractmethod
    def on_put(self, key: BlockKey, size: int) -> None:
        """``key`` became resident (a put or a promotion/demotion into the tier). A put of a
        key already tracked counts as an access."""

    @abstractmethod
    def on_hit(self, key: BlockKey) -> None:
        """``key`` was read from the tier. Unknown keys are ignored."""

    @abstractmethod
    def on_remove(self, key: BlockKey) -> None:
        """``key`` left the tier (evicted, demoted, promoted away or deleted). Unknown keys are
        ignored."""

    def on_put_many(self, keys: Sequence[BlockKey], sizes: Sequence[int]) -> None:
        """:meth:`on_put` of each key in order (one call for a batch; policies on a request
        path override it with a loop of their own)."""
        for key, size in zip(keys, sizes, strict=True):
            self.on_put(key, size)

    def on_hit_many(self, keys: Sequence[BlockKey]) -> None:
        """:meth:`on_hit` of each key in order."""
        for key in keys:
            self.on_hit(key)

    def on_remove_many(self, keys: Sequence[BlockKey]) -> None:
        """:meth:`on_remove` of each key in order."""
        for key in keys:
            self.on_remove(key)

    @abstractmethod
    def victims(self, n: int, evictable: Callable[[BlockKey], bool]) -> list[BlockKey]:
        """Up to ``n`` resident keys to evict next, best victim first, skipping keys for which
        ``evictable(key)`` is False (pinned). Does not forget them: the store calls
        :meth:`on_remove` for each key it actually removes. Returns fewer than ``n`` keys only
        when fewer evictable keys are resident."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of tracked resident keys."""

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

class Resident(Protocol):
    """The keys a tier holds, as the tier itself indexes them."""

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def sample(self, n: int, rng: random.Random) -> list[BlockKey]:
        """``n`` resident keys drawn at random (duplicates allowed), or every resident key
        when ``n >= len(self)``."""
        ...


class DrawsFromTier(ABC):
    """A policy that can keep only scores and draw its victims from the keys a tier holds
    (the sampled policies, for a tier that indexes itself)."""

    @abstractmethod
    def attach(self, resident: Resident) -> None:
        """Draw victims from ``resident`` instead of an own pool of keys."""


class Admission(ABC):
    """Decides whether a block may enter a tier (for example: the disk tier admits only blocks
    seen at least twice). Told about every access the store sees for any tier."""

    name: str = "admission"

    @abstractmethod
    def on_access(self, key: BlockKey) -> None:
        """``key`` was put or hit anywhere in the store."""

    @abstractmethod
    def admit(self, key: BlockKey) -> bool:
        """Whether ``key`` may be written to the tier this rule guards."""

    def on_access_many(self, keys: Sequence[BlockKey]) -> None:
        """:meth:`on_access` of each key in order."""
        for key in keys:
            self.on_access(key)

    def admit_many(self, keys: Sequence[BlockKey]) -> list[bool]:
        """:meth:`admit` of each key (asks nothing else: no access is recorded)."""
        return [self.admit(key) for key in keys]

    def forget(self, key: BlockKey) -> None:  # noqa: B027 - optional hook
        """``key`` was deleted from the whole store."""
