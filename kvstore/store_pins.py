"""Pins and leases: blocks a reader holds stay put until released or until their lease ends.

A pin keeps a block from eviction (and its host slots from reuse) for ``lease_s`` seconds,
per owner; pinning again renews it, :meth:`Pinning.release` drops it. An owner that goes away
(the server calls ``expire_leases(owner)`` when its last connection closes) loses its pins,
reservations and staged places at once. The host slots of a deleted block that a reader still
held are freed here once that reader's pin has run out.

A mixin of :class:`kvstore.store.Store` over the state of :class:`kvstore.store_core.StoreCore`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvstore.store_stage import StagedWrites


class Pinning(StagedWrites):
    """``pin``, ``release`` and ``expire_leases``."""

    def pin(
        self,
        namespace: str,
        hashes: Sequence[bytes],
        *,
        lease_s: float | None = None,
        owner: str = "",
    ) -> list[bool]:
        """Pin existing blocks for ``lease_s`` seconds (renewed by pinning again). True where
        the block exists and is now pinned."""
        self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        lease = self._lease(lease_s)
        out: list[bool] = []
        with self._lock:
            for key in keys:
                entry = self._index.get(key)
                ok = entry is not None and not entry.pending and entry.tiers != 0
                if ok:
                    self._leases.pin(key, owner, lease)
                out.append(ok)
        return out

    def release(
        self, namespace: str, hashes: Sequence[bytes], *, owner: str = "", nowait: bool = False
    ) -> int:
        """Drop ``owner``'s pins on ``hashes``; returns how many it held. With ``nowait``,
        raises :class:`~kvstore.errors.WouldBlock` rather than wait for the store lock."""
        keys = self._keys(namespace, hashes)
        with self._hold(nowait):
            return sum(self._leases.release(key, owner) for key in keys)

    def expire_leases(self, owner: str | None = None) -> int:
        """Drop expired pins and reservations, or all of ``owner``'s (staged places too) when
        given."""
        with self._lock:
            dropped = self._leases.expire(owner)
            if owner is not None:
                dropped += self._drop_staged(owner)
            self._free_retired(time.monotonic())
            now = time.monotonic()
            for key, (who, expiry, _) in list(self._reservations.items()):
                if (owner is not None and who == owner) or expiry <= now:
                    self._unreserve(key)
                    dropped += 1
            return dropped

    def _free_retired(self, now: float) -> None:
        """Free the host slots of deleted blocks whose readers' pins have run out."""
        keep = []
        host = self._host_pos()
        for until, placeholder in self._retired:
            if until <= now and host is not None:
                self._slab(host).unreserve(placeholder)
            else:
                keep.append((until, placeholder))
        self._retired = keep
