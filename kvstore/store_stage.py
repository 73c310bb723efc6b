"""Staged shared-memory writes: a local put in one round trip instead of two.

:meth:`reserve_write` needs the block hashes, so a put through shared memory costs a round
trip to reserve and one to commit. A client that puts often instead holds a few anonymous
places in the host slab, sized for one namespace's blocks (:meth:`stage_write`): it copies a
block into one of them and names the block's hash in :meth:`commit_staged`, which gives the
place that hash and publishes it, and the server hands back fresh places in the same reply.

Staged places are charged to the host tier like any reservation, are never visible to reads,
and belong to their owner until used or until the owner's leases are dropped
(``expire_leases(owner)``, which the server calls when the owner's last connection closes).
Staging never takes more than :data:`OWNER_SHARE` of the host tier per owner nor
:data:`TOTAL_SHARE` for all owners together: a client asking for more gets fewer places and
writes the usual way (reserve, then commit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.errors import StaleStagingError, WouldBlock
from kvstore.index import Entry
from kvstore.store_shm import Extents, SharedMemoryPath
from kvstore.types import BlockKey, PutResult

STAGE_NS = "\x00staged"  # namespace of placeholder keys; no registered name contains NUL
OWNER_SHARE = 1 / 8  # of the host tier's capacity, staged by one owner at most
TOTAL_SHARE = 1 / 4  # staged by all owners together at most


@dataclass(slots=True)
class Staged:
    """One owner's staged places: ``places[offset] = (namespace, placeholder key, extents)``,
    where ``offset`` (the place's first byte in the slab) is the id the client sends back,
    and the bytes they are charged."""

    places: dict[int, tuple[str, BlockKey, Extents]] = field(default_factory=dict)
    charged: int = 0


class StagedWrites(SharedMemoryPath):
    """Mixin of :class:`kvstore.store.Store`."""

    _staged: dict[str, Staged]
    _staged_bytes: int

    def stage_write(
        self, namespace: str, count: int, *, owner: str = "", nowait: bool = False
    ) -> list[Extents]:
        """Up to ``count`` new staged places for blocks of ``namespace`` (fewer past the
        staging shares of the host tier, none if the tier cannot make room). With
        ``nowait``, raises :class:`~kvstore.errors.WouldBlock` rather than wait or evict."""
        host = self._require_host()
        ns = self.namespace(namespace)
        if count < 0:
            raise ValueError(f"count must be non-negative, got {count}")
        tier = self._slab(host)
        each = tier.charge(ns.block_bytes)
        with self._hold(nowait):
            self._check_open()
            mine = self._staged.setdefault(owner, Staged())
            room = min(int(tier.capacity_bytes * OWNER_SHARE) - mine.charged,
                       int(tier.capacity_bytes * TOTAL_SHARE) - self._staged_bytes)
            count = min(count, max(0, room // each))
            need = each * count
            if nowait and tier.used_bytes() + need > tier.capacity_bytes:
                raise WouldBlock("the host tier must evict to make room")
            if not count or not self._make_room(host, need):
                return []
            self._placeholder_seq += count
            last = self._placeholder_seq
            keys = [(STAGE_NS, f"{owner}/{last - i}".encode()) for i in range(count)]
            extents = tier.reserve_many([(k, ns.block_bytes) for k in keys])
            for key, ext in zip(keys, extents, strict=True):
                mine.places[ext[0][0]] = (namespace, key, ext)
            mine.charged += need
            self._staged_bytes += need
        return extents

    def commit_staged(
        self,
        namespace: str,
        hashes: Sequence[bytes],
        places: Sequence[int],
        *,
        owner: str = "",
        nowait: bool = False,
    ) -> tuple[PutResult, list[int]]:
        """Publish ``hashes[i]``, written into the staged place that starts at ``places[i]``.
        Returns the result and the places used; the places of blocks the store already had
        stay staged. Raises :class:`~kvstore.errors.StaleStagingError`, changing nothing, if a
        place is not one of this owner's for this namespace; with ``nowait``,
        :class:`~kvstore.errors.WouldBlock` rather than wait, copy down or evict."""
        host = self._require_host()
        ns = self.namespace(namespace)
        keys = self._keys(namespace, hashes)
        if len(keys) != len(places):
            raise ValueError(f"{len(keys)} hashes but {len(places)} staged places")
        if len(set(places)) != len(places):
            raise ValueError("a staged place is named twice")
        through = self._writes_through(host)
        with self._hold(nowait):
            if nowait and self._commit_blocked(host):
                raise WouldBlock("the commit must copy or evict to a lower tier")
            mine = self._staged.get(owner) or Staged()
            for place in places:
                held = mine.places.get(place)
                if held is None or held[0] != namespace:
                    raise StaleStagingError(
                        f"staged place {place} is not held by this client for {namespace!r}; "
                        "reserve again (the server restarted or dropped this client's leases)")
            fresh: list[tuple[BlockKey, int]] = []
            seen: set[BlockKey] = set()
            existing = refused = 0
            for key, place in zip(keys, places, strict=True):
                entry = self._index.get(key)
                if key in seen or (entry is not None and not entry.pending):
                    existing += 1
                elif entry is not None:  # another writer reserved it and has not committed
                    refused += 1
                else:
                    seen.add(key)
                    fresh.append((key, place))
            tier = self._slab(host)
            tier.rekey_reserved([(mine.places[p][1], k) for k, p in fresh])
            mine.charged -= tier.charge(ns.block_bytes) * len(fresh)
            self._staged_bytes -= tier.charge(ns.block_bytes) * len(fresh)
            for key, place in fresh:
                ext = mine.places.pop(place)[2]
                self._index[key] = Entry(ns.block_bytes, None, ns.layout_id, pending=True)
                self._reservations[key] = (owner, math.inf, ext)
            self._publish(host, [k for k, _ in fresh], through)
        return PutResult(len(fresh), existing, refused), [p for _, p in fresh]

    def _drop_staged(self, owner: str) -> int:
        """Free every place ``owner`` has staged (lock held)."""
        mine = self._staged.pop(owner, None) or Staged()
        self._staged_bytes -= mine.charged
        host = self._host_pos()
        if host is not None:
            for _, key, _ in mine.places.values():
                self._slab(host).unreserve(key)
        return len(mine.places)
