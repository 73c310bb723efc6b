"""Pins with leases, and reads in flight: a pinned block or one being read is never evicted,
and a lease that runs out unpins it so that a crashed client cannot pin forever."""

from __future__ import annotations

import time
from collections.abc import Callable

from kvstore.types import BlockKey


class LeaseTable:
    """Pin counts per ``(key, owner)`` with one expiry each (renewed by each pin).

    Not thread-safe: the store calls it under its lock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pins: dict[BlockKey, dict[str, list[float]]] = {}  # key -> owner -> [count, expiry]
        self._reading: dict[BlockKey, int] = {}  # reads in flight outside the store lock

    def start_read(self, key: BlockKey) -> None:
        """A read of ``key`` runs outside the store lock: keep the block until it ends."""
        self._reading[key] = self._reading.get(key, 0) + 1

    def end_read(self, key: BlockKey) -> None:
        left = self._reading.get(key, 0) - 1
        if left > 0:
            self._reading[key] = left
        else:
            self._reading.pop(key, None)

    def evictable(self, key: BlockKey) -> bool:
        """Neither pinned nor being read (what a policy may name as a victim)."""
        return key not in self._reading and not self.is_pinned(key)

    def pin(self, key: BlockKey, owner: str, lease_s: float) -> None:
        owners = self._pins.setdefault(key, {})
        slot = owners.get(owner)
        expiry = self._clock() + lease_s
        if slot is None:
            owners[owner] = [1.0, expiry]
        else:
            slot[0] += 1
            slot[1] = max(slot[1], expiry)

    def release(self, key: BlockKey, owner: str) -> bool:
        """Drop one pin of ``owner`` on ``key``; False if it held none."""
        owners = self._pins.get(key)
        if not owners or owner not in owners:
            return False
        slot = owners[owner]
        slot[0] -= 1
        if slot[0] <= 0:
            del owners[owner]
            if not owners:
                del self._pins[key]
        return True

    def is_pinned(self, key: BlockKey) -> bool:
        owners = self._pins.get(key)
        if not owners:
            return False
        now = self._clock()
        live = any(expiry > now for _, expiry in owners.values())
        if not live:
            del self._pins[key]
        return live

    def expire(self, owner: str | None = None) -> int:
        """Drop expired pins, or every pin of ``owner`` when given. Returns pins dropped."""
        now = self._clock()
        dropped = 0
        for key in list(self._pins):
            owners = self._pins[key]
            for who in list(owners):
                if (owner is not None and who == owner) or owners[who][1] <= now:
                    dropped += int(owners.pop(who)[0])
            if not owners:
                del self._pins[key]
        return dropped

    def until(self, key: BlockKey) -> float:
        """When the last live pin on ``key`` expires (0.0 if it has none)."""
        owners = self._pins.get(key)
        return max((expiry for _, expiry in owners.values()), default=0.0) if owners else 0.0

    def forget(self, key: BlockKey) -> None:
        self._pins.pop(key, None)

    def pinned_keys(self) -> list[BlockKey]:
        return list(self._pins)

    def __len__(self) -> int:
        return len(self._pins)
