"""Pins with leases, and reads in flight: a pinned block or one being read is never evicted,
and a lease that runs out unpins it so that a crashed client cannot pin forever.

Pins taken for a tenant are charged to it: the bytes of the distinct blocks its owners hold
pinned, at most ``quota`` bytes at once (:class:`~kvstore.errors.PinQuotaError` past it). A
pin taken without a tenant (the admin, a library user) is never charged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.config import DEFAULT_LEASE_S, DEFAULT_MAX_LEASE_S
from kvstore.errors import InvalidLeaseError, PinQuotaError
from kvstore.types import BlockKey


@dataclass(slots=True)
class Pin:
    """One owner's pins on one block: how many, until when, and whom they are charged to."""

    count: int
    expiry: float
    tenant: str | None
    size: int


class LeaseTable:
    """Pin counts per ``(key, owner)`` with one expiry each (renewed by each pin), and the
    bytes each tenant holds pinned.

    Not thread-safe: the store calls it under its lock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 quota: int | None = None, *, default_s: float = DEFAULT_LEASE_S,
                 max_s: float = DEFAULT_MAX_LEASE_S) -> None:
        self._clock = clock
        self._quota = quota  # bytes one tenant may hold pinned; None: no limit
        self._default_s = default_s  # the lease of a call that names none
        self._max_s = max_s  # every lease asked for longer is cut to this
        self._pins: dict[BlockKey, dict[str, Pin]] = {}
        self._reading: dict[BlockKey, int] = {}  # reads in flight outside the store lock
        # tenant -> key -> how many of the tenant's owners pin it (charged once per block)
        self._held: dict[str, dict[BlockKey, int]] = {}
        self._bytes: dict[str, int] = {}  # tenant -> bytes of the blocks in _held[tenant]

    def term(self, lease_s: float | None) -> float:
        """The lease every pinning call gets: ``lease_s`` (the default when None) cut to the
        maximum, so that no caller holds a pin or a reservation longer. Raises
        :class:`~kvstore.errors.InvalidLeaseError` unless it is a finite, positive number."""
        lease = self._default_s if lease_s is None else float(lease_s)
        if not (lease > 0 and math.isfinite(lease)):
            raise InvalidLeaseError(f"lease_s must be a finite, positive number of seconds, "
                                    f"got {lease_s!r}")
        return min(lease, self._max_s)

    def start_reads(self, keys: Sequence[BlockKey]) -> None:
        """Reads of ``keys`` run outside the store lock: keep the blocks until they end (a key
        named twice is read twice)."""
        reading = self._reading
        for key in keys:
            reading[key] = reading.get(key, 0) + 1

    def end_reads(self, keys: Sequence[BlockKey]) -> None:
        """The reads :meth:`start_reads` began of ``keys`` are over."""
        reading = self._reading
        for key in keys:
            left = reading.get(key, 0) - 1
            if left > 0:
                reading[key] = left
            else:
                reading.pop(key, None)

    def evictable(self, key: BlockKey) -> bool:
        """Neither pinned nor being read (what a policy may name as a victim)."""
        return key not in self._reading and not self.is_pinned(key)

    def pin_many(self, keys: Sequence[BlockKey], owner: str, lease_s: float, *, size: int = 0,
                 tenant: str | None = None) -> None:
        """Pin each of ``keys`` (each ``size`` bytes) for ``owner`` until ``lease_s`` from now;
        a key named twice is pinned twice. With ``tenant``, the blocks it does not hold yet
        are charged to it: raises :class:`~kvstore.errors.PinQuotaError`, pinning nothing,
        if that would take it past the quota."""
        if tenant is not None and self._quota is not None:
            self._check_quota(keys, tenant, size)
        expiry = self._clock() + lease_s
        for key in keys:
            owners = self._pins.setdefault(key, {})
            slot = owners.get(owner)
            if slot is None:
                owners[owner] = Pin(1, expiry, tenant, size)
                self._charge(tenant, key, size)
            else:
                slot.count += 1
                slot.expiry = max(slot.expiry, expiry)

    def release(self, key: BlockKey, owner: str) -> bool:
        """Drop one pin of ``owner`` on ``key``; False if it held none."""
        return self.release_many((key,), owner) > 0

    def release_many(self, keys: Sequence[BlockKey], owner: str) -> int:
        """Drop one pin of ``owner`` on each of ``keys`` (a key named twice, two); how many it
        held."""
        pins = self._pins
        dropped = 0
        for key in keys:
            owners = pins.get(key)
            slot = owners.get(owner) if owners else None
            if owners is None or slot is None:
                continue
            dropped += 1
            slot.count -= 1
            if slot.count <= 0:
                self._drop(key, owners, owner)
        return dropped

    def is_pinned(self, key: BlockKey) -> bool:
        owners = self._pins.get(key)
        if not owners:
            return False
        now = self._clock()
        live = any(slot.expiry > now for slot in owners.values())
        if not live:
            self.forget(key)
        return live

    def expire(self, owner: str | None = None) -> int:
        """Drop expired pins, or every pin of ``owner`` when given. Returns pins dropped."""
        now = self._clock()
        dropped = 0
        for key in list(self._pins):
            owners = self._pins[key]
            for who in list(owners):
                slot = owners[who]
                if (owner is not None and who == owner) or slot.expiry <= now:
                    dropped += slot.count
                    self._drop(key, owners, who)
        return dropped

    def cut(self, owner: str, within_s: float) -> int:
        """Make every pin of ``owner`` run out ``within_s`` seconds from now at the latest
        (those running out sooner keep their time). Returns how many pins were cut."""
        until = self._clock() + within_s
        cut = 0
        for owners in self._pins.values():
            slot = owners.get(owner)
            if slot is not None and slot.expiry > until:
                slot.expiry = until
                cut += slot.count
        return cut

    def until(self, key: BlockKey) -> float:
        """When the last live pin on ``key`` expires (0.0 if it has none)."""
        owners = self._pins.get(key)
        return max((slot.expiry for slot in owners.values()), default=0.0) if owners else 0.0

    def forget(self, key: BlockKey) -> None:
        """Drop every pin on ``key`` (the block is gone, or none of its pins is live)."""
        for slot in self._pins.pop(key, {}).values():
            self._uncharge(slot.tenant, key, slot.size)

    def pinned_bytes(self, tenant: str) -> int:
        """Bytes of the blocks ``tenant`` holds pinned (expired pins count until dropped)."""
        return self._bytes.get(tenant, 0)

    def total_bytes(self) -> int:
        """Bytes of every pinned block, each once however many owners pin it (expired pins
        count until dropped)."""
        return sum(next(iter(owners.values())).size for owners in self._pins.values() if owners)

    def pinned_keys(self) -> list[BlockKey]:
        return list(self._pins)

    def __len__(self) -> int:
        return len(self._pins)

    def _check_quota(self, keys: Sequence[BlockKey], tenant: str, size: int) -> None:
        assert self._quota is not None
        if self._bytes.get(tenant, 0) + self._new_bytes(keys, tenant, size) <= self._quota:
            return
        self.expire()  # pins that ran out stay charged until dropped: drop them, then recount
        held = self._bytes.get(tenant, 0)
        want = self._new_bytes(keys, tenant, size)
        if held + want > self._quota:
            raise PinQuotaError(
                f"tenant {tenant!r} holds {held} bytes pinned; {want} more would pass its "
                f"quota of {self._quota} bytes (max_pinned_bytes_per_tenant): release pins "
                "or pin fewer blocks at once")

    def _new_bytes(self, keys: Sequence[BlockKey], tenant: str, size: int) -> int:
        held = self._held.get(tenant, {})
        return size * len({key for key in keys if key not in held})

    def _drop(self, key: BlockKey, owners: dict[str, Pin], owner: str) -> None:
        slot = owners.pop(owner)
        self._uncharge(slot.tenant, key, slot.size)
        if not owners:
            del self._pins[key]

    def _charge(self, tenant: str | None, key: BlockKey, size: int) -> None:
        if tenant is None:
            return
        held = self._held.setdefault(tenant, {})
        count = held.get(key, 0)
        if count == 0:
            self._bytes[tenant] = self._bytes.get(tenant, 0) + size
        held[key] = count + 1

    def _uncharge(self, tenant: str | None, key: BlockKey, size: int) -> None:
        if tenant is None:
            return
        held = self._held[tenant]
        count = held[key] - 1
        if count:
            held[key] = count
            return
        del held[key]
        self._bytes[tenant] -= size
        if not held:
            del self._held[tenant], self._bytes[tenant]
