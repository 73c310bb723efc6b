"""Staged shared-memory writes: a local put in one round trip instead of two.

``reserve_write`` needs the block hashes, so a put through shared memory costs a round trip to
reserve and one to commit. A client that puts often instead holds a few anonymous places in
the host slab, sized for one namespace's blocks (``stage_write``): it copies a block into one
of them and names the block's hash in ``commit_staged``, which gives the place that hash and
publishes it, and the server hands back fresh places in the same reply.

Staged places are charged to the host tier like any reservation, are never visible to reads,
and belong to their owner until used or until the owner's leases are dropped
(``expire_leases(owner)``, which the server calls when the owner's last connection closes).
Staging never takes more than :data:`OWNER_SHARE` of the host tier per owner nor
:data:`TOTAL_SHARE` for all owners together: a client asking for more gets fewer places and
writes the usual way (reserve, then commit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvstore.errors import StaleStagingError, WouldBlock
from kvstore.namespace import Namespace
from kvstore.store.placer import Placer
from kvstore.store.stack import TierStack
from kvstore.tiers.slots import Extents
from kvstore.types import BlockKey

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


class Staging:
    """Every owner's staged places in the host slab. Called under the store lock."""

    def __init__(self, stack: TierStack, placer: Placer, next_ids: Callable[[int], int]) -> None:
        self._stack = stack
        self._placer = placer
        self._next_ids = next_ids
        self._owners: dict[str, Staged] = {}
        self._bytes = 0

    def stage(self, ns: Namespace, count: int, *, owner: str, nowait: bool) -> list[Extents]:
        """Up to ``count`` new places for blocks of ``ns`` (fewer past the staging shares, none
        if the host tier cannot make room)."""
        if count < 0:
            raise ValueError(f"count must be non-negative, got {count}")
        slab, host = self._stack.slab(), int(self._stack.host or 0)
        each = slab.charge(ns.block_bytes)
        mine = self._owners.setdefault(owner, Staged())
        room = min(int(slab.capacity_bytes * OWNER_SHARE) - mine.charged,
                   int(slab.capacity_bytes * TOTAL_SHARE) - self._bytes)
        count = min(count, max(0, room // each))
        need = each * count
        if nowait and not self._placer.fits_now(host, need):
            raise WouldBlock("the host tier must evict to make room")
        if not count or not self._placer.make_room(host, need):
            return []
        last = self._next_ids(count)
        keys = [(STAGE_NS, f"{owner}/{last - i}".encode()) for i in range(count)]
        extents = slab.reserve_many([(k, ns.block_bytes) for k in keys])
        for key, ext in zip(keys, extents, strict=True):
            mine.places[ext[0][0]] = (ns.name, key, ext)
        mine.charged += need
        self._bytes += need
        return extents

    def check(self, namespace: str, places: Sequence[int], *, owner: str,
              gens: Sequence[int | None] | None = None) -> None:
        """Raise :class:`~kvstore.errors.StaleStagingError` unless every place is one of
        ``owner``'s for ``namespace`` (and, with ``gens``, still of generation ``gens[i]``:
        a place dropped and staged again at the same offset is another place)."""
        mine = self._owners.get(owner) or Staged()
        generations = self._stack.slab().generations
        for i, place in enumerate(places):
            held = mine.places.get(place)
            if held is None or held[0] != namespace or (
                    gens is not None and generations([held[2]])[0] != gens[i]):
                raise StaleStagingError(
                    f"staged place {place} is not held by this client for {namespace!r}; "
                    "reserve again (the server restarted or dropped this client's leases)")

    def claim(self, ns: Namespace, used: list[tuple[BlockKey, int]], *,
              owner: str) -> list[Extents]:
        """Give each checked place ``used[i][1]`` the key ``used[i][0]``: the slots become that
        block's reservation, no longer staged. Returns their extents."""
        if not used:
            return []
        mine = self._owners[owner]
        self._stack.slab().rekey_reserved([(mine.places[p][1], k) for k, p in used])
        charge = self._stack.slab().charge(ns.block_bytes) * len(used)
        mine.charged -= charge
        self._bytes -= charge
        return [mine.places.pop(p)[2] for _, p in used]

    def drop(self, owner: str) -> int:
        """Free every place ``owner`` has staged; how many."""
        mine = self._owners.pop(owner, None) or Staged()
        self._bytes -= mine.charged
        if self._stack.host is not None:
            slab = self._stack.slab()
            for _, key, _ in mine.places.values():
                slab.unreserve(key)
        return len(mine.places)

    def places(self) -> list[BlockKey]:
        """The placeholder keys of every staged place."""
        return [key for mine in self._owners.values() for _, key, _ in mine.places.values()]

    def drop_all(self) -> None:
        for owner in list(self._owners):
            self.drop(owner)
