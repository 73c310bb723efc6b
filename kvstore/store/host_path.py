"""The store's zero-copy path for clients on the same host.

The host tier's slab lives in shared memory. A local client asks the store for byte extents
inside it and copies block bytes itself, so only control messages cross a socket:

- read: :meth:`HostPath.acquire_read` makes each block resident in the host tier, pins it
  under a lease and returns its extents; the client copies, then calls ``release``.
- write: :meth:`HostPath.reserve_write` allocates host slots for blocks the store does not
  have yet (invisible to every reader); the client copies into them, then
  :meth:`HostPath.commit_write` publishes them, or :meth:`HostPath.abort_write` frees them. A
  reservation whose lease runs out is freed, so a client that dies mid-write leaves nothing
  behind, unless the server itself receives into it (:mod:`kvstore.store.reservations`).
  Staged places (:mod:`kvstore.store.staging`) make a put one round trip.
- delete (:mod:`kvstore.store.deletes`): the host slots of a deleted block that a reader still
  has pinned stay allocated (unreadable, "retired") until that pin would have expired, so the
  reader copies the bytes it asked for, never those of a block stored there after the delete.

Fencing: every extent list goes out with its generation (see :mod:`kvstore.tiers.slots`),
read in the same hold of the store lock that pinned, reserved or staged it
(:class:`~kvstore.tiers.slots.Fenced`): read later, it may be that of another block the slots
went to meanwhile. A commit that names generations refuses a block whose slots were freed
since (its lease ran out, its owner's places were dropped): the bytes such a late writer
copied never become a block. Honest clients also check the number before copying in and after
copying out, so a late copy is a miss, never another block's bytes.

Checksums (:mod:`kvstore.store.verify`): a commit hashes each block's bytes where they lie
and records that; a commit that sends the client's checksums refuses a block whose bytes
differ (a late writer copied over them), so a late copy never becomes a block; a block it
lands on after the commit fails its next verified read and is dropped. Reads hand out each
block's checksum with its extents.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvstore.errors import CapacityError, WouldBlock
from kvstore.namespace import Namespace
from kvstore.store.books import Books
from kvstore.store.deletes import Deletes
from kvstore.store.index import Entry, tops
from kvstore.store.lock import StoreLock
from kvstore.store.placer import Item, Placer
from kvstore.store.reader import Reader
from kvstore.store.reservations import Held, Reservations
from kvstore.store.stack import TierStack
from kvstore.store.staging import Staging
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.slab import SlabTier
from kvstore.tiers.slots import Fenced, FencedPlaces, Granted
from kvstore.types import BlockKey, PutResult


class HostPath:
    """Reservations and (through its parts :class:`Staging` and :class:`Deletes`) staged
    places and retired slots of the host tier, and the operations over them. Every method
    expects the store lock to be held, except :meth:`acquire_read`, which takes it itself
    (through its :class:`~kvstore.store.lock.StoreLock`: it leaves it while
    the reader promotes blocks from a persistent tier)."""

    def __init__(self, stack: TierStack, books: Books, placer: Placer, reader: Reader,
                 lock: StoreLock) -> None:
        self._stack, self._placer, self._reader, self._lock = stack, placer, reader, lock
        self._ledger, self._tally, self._leases = books.ledger, books.tally, books.leases
        self._sizing = books.sizing
        self._checks = books.checks
        self._seq = 0  # numbers placeholder keys (staged places, retired and doomed slots)
        self._reservations = Reservations(stack, books.ledger, self._next_ids)  # in flight
        self.staging = Staging(stack, placer, self._next_ids)
        self.deletes = Deletes(stack, books, self._next_ids)

    # -- reads -------------------------------------------------------------------------------
    def acquire_read(self, keys: list[BlockKey], *, lease: float, owner: str, nowait: bool,
                     promote: bool, size: int = 0, tenant: str | None = None) -> Granted:
        """Extents in the host slab of each block (None for a miss), each pinned for ``lease``
        seconds under ``owner``, with their generations: the client copies the bytes, checks
        the generation, then releases them. Blocks in lower tiers are promoted first. Counts
        as a get in the stats. With ``nowait``, raises :class:`~kvstore.errors.WouldBlock`
        rather than wait for the lock or promote. With ``promote=False`` only blocks the host
        tier holds now are served: the others get None (and are not counted). Raises
        :class:`~kvstore.errors.CapacityError` if stored blocks cannot be staged in the host
        tier (it is full of pinned blocks), and with ``tenant`` (pins charged to it, ``size``
        bytes a block) :class:`~kvstore.errors.PinQuotaError`, pinning nothing, past its
        quota."""
        host, slab = self._host()
        below: dict[BlockKey, int] = {}  # block -> the tier it was read from
        kept: list[BlockKey] = []  # the host's blocks stay while the rest come up beside them:
        if promote:  # the room made for those never evicts these (nor the rest, once up)
            with self._lock.hold(nowait):
                below = {k: top for k, top in zip(keys, tops(self._ledger.visible_many(keys)),
                                                  strict=True) if top > host}
                if below and not nowait:
                    kept = keys
                    self._leases.start_reads(kept)
        try:
            if below:
                if nowait:
                    raise WouldBlock(f"{len(below)} blocks must be promoted from a lower tier")
                self._reader.read(list(below), promote=True, count=False, promote_to=host,
                                  counted_by_caller=True)
            with self._lock.hold(nowait):
                entries = self._ledger.get_many(keys)
                stuck = promote and sum(
                    e is not None and e.tiers != 0 and not e.holds(host) for e in entries)
                if stuck:  # stored, but the host tier could not take it: not a miss
                    raise CapacityError(
                        f"{stuck} stored blocks could not be staged in the host tier: it is full "
                        "of pinned blocks; release pins or read fewer blocks at once")
                served = [host if entry is not None and not entry.pending and entry.holds(host)
                          else -1 for entry in entries]
                hits = [key for key, pos in zip(keys, served, strict=True) if pos >= 0]
                self._leases.pin_many(hits, owner, lease, size=size, tenant=tenant)  # all or none
                self._ledger.hits(host, hits)
                out = [slab.extents(k) if pos >= 0 else None for k, pos in zip(keys, served,
                                                                                 strict=True)]
                gens = slab.generations(out)  # while the pins hold: a short one may run out after
                sums = [e.checksum if pos >= 0 and e is not None else None
                        for e, pos in zip(entries, served, strict=True)]
                if not promote:  # only what was served was read
                    keys, served = hits, [host] * len(hits)
                self._tally.reads([k[0] for k in keys], served, [pos >= 0 for pos in served])
                self._sizing.reads(keys, [below.get(k, pos) if pos >= 0 else -1
                                          for k, pos in zip(keys, served, strict=True)])
        finally:
            if kept:
                with self._lock:
                    self._leases.end_reads(kept)
        return Granted(out, gens, sums)

    # -- writes ------------------------------------------------------------------------------
    def reserve_write(self, ns: Namespace, keys: list[BlockKey], *, expiry: float, owner: str,
                      nowait: bool, receiving: bool = False) -> Fenced:
        """Host-slab extents to write each new block into, with their generations; None where
        the store already has the block (or another writer reserved it): skip those. Raises
        :class:`~kvstore.errors.CapacityError` if the host tier cannot make room, and with
        ``nowait`` :class:`~kvstore.errors.WouldBlock` rather than wait for the lock or evict.
        The reservation is freed at ``expiry`` (monotonic time) unless committed; with
        ``receiving`` (the caller fills the places itself, then always commits or aborts),
        only doomed (:mod:`kvstore.store.reservations`)."""
        host, slab = self._host()
        fresh = self._ledger.unknown(list(dict.fromkeys(keys)))
        need = slab.charge(ns.block_bytes) * len(fresh)
        if nowait and not self._placer.fits_now(host, need):
            raise WouldBlock("the host tier must evict to make room")
        if not self._placer.make_room(host, need):
            raise CapacityError(
                f"host tier has no room for {len(fresh)} blocks: everything resident is "
                "pinned or being read")
        extents = slab.reserve_many([(k, ns.block_bytes) for k in fresh])
        for key, ext in zip(fresh, extents, strict=True):
            self._ledger.reserve(key, Entry(ns.block_bytes, None, ns.layout_id))
            self._reservations.add(key, Held(owner, expiry, ext, receiving))
        where = dict(zip(fresh, extents, strict=True))
        out = [where.pop(k, None) for k in keys]  # a key asked twice is written once
        return Fenced(out, slab.generations(out))  # before the reservation can run out

    def commit_write(self, keys: list[BlockKey], *, owner: str, nowait: bool,
                     gens: Sequence[int | None] | None = None,
                     sums: Sequence[int | None] | None = None,
                     landed: Sequence[int | None] | None = None) -> PutResult:
        """Publish blocks ``owner`` reserved and wrote. Keys it did not reserve, or (with
        ``gens``) whose reservation is not the generation the writer was given, count as
        ``existing`` if stored, else ``refused``; so do keys whose receiving reservation was
        doomed (their places are freed now), and (its places freed) a block whose bytes do
        not match its checksum in ``sums``. ``landed``: each block's checksum as a socket
        receive saw its bytes land (None: hash it where it lies now). With ``nowait``, raises
        :class:`~kvstore.errors.WouldBlock` (publishing nothing) rather than wait for the lock,
        copy to a write-through tier or evict past the high watermark."""
        host, slab = self._host()
        if gens is not None and len(gens) != len(keys):
            raise ValueError(f"{len(keys)} hashes but {len(gens)} generations")
        if sums is not None and len(sums) != len(keys):
            raise ValueError(f"{len(keys)} hashes but {len(sums)} checksums")
        wanted = dict(zip(keys, gens, strict=True)) if gens is not None else None
        sent = dict(zip(keys, sums, strict=True)) if sums is not None else None
        seen = dict(zip(keys, landed, strict=True)) if landed is not None else {}
        existing = refused = 0
        self._check_commit(host, nowait)
        doomed = self._reservations.end_doomed(owner, keys)  # deleted or run out meanwhile
        mine: list[BlockKey] = []
        for key in dict.fromkeys(keys):
            held = self._reservations.get(key)
            if key in doomed:
                refused += 1
            elif held is not None and held[0] == owner and (
                    wanted is None or slab.generations([held[2]])[0] == wanted[key]):
                mine.append(key)
            elif self._ledger.visible(key) is not None:
                existing += 1
            else:
                refused += 1
        existing += len(keys) - len(set(keys))  # the same block twice: written once
        written = len(mine)
        mine = self._seal(mine, None if sent is None else [sent[k] for k in mine],
                          [seen.get(k) for k in mine])
        refused += written - len(mine)
        self._publish(host, mine)
        if mine:
            self._tally.stored(mine[0][0], len(mine))
        return PutResult(len(mine), existing, refused)

    def abort_write(self, keys: list[BlockKey], *, owner: str) -> int:
        """Free ``owner``'s reservations (doomed too) of ``keys``; how many were freed."""
        freed = len(self._reservations.end_doomed(owner, keys))
        for key in keys:
            held = self._reservations.get(key)
            if held is not None and held[0] == owner:
                self._reservations.free(key)
                freed += 1
        return freed

    def stage_write(self, ns: Namespace, count: int, *, owner: str,
                    nowait: bool) -> FencedPlaces:
        """Up to ``count`` new staged places for blocks of ``ns`` (fewer past the staging
        shares of the host tier, none if the tier cannot make room; see
        :mod:`kvstore.store.staging`), with their generations. With ``nowait``, raises
        :class:`~kvstore.errors.WouldBlock` rather than wait or evict."""
        _, slab = self._host()
        places = self.staging.stage(ns, count, owner=owner, nowait=nowait)
        return FencedPlaces(places, slab.generations(places))  # before they can be dropped

    def commit_staged(self, ns: Namespace, keys: list[BlockKey], places: Sequence[int], *,
                      owner: str, nowait: bool,
                      gens: Sequence[int | None] | None = None,
                      sums: Sequence[int | None] | None = None) -> tuple[PutResult, list[int]]:
        """Publish ``keys[i]``, written into the staged place that starts at ``places[i]``
        (refused, its place used, if its bytes do not match ``sums[i]``). Returns the result
        and the places used; the places of blocks the store already had stay staged. Raises
        :class:`~kvstore.errors.StaleStagingError`, changing nothing, if a place is not one of
        this owner's for this namespace (or, with ``gens``, not of that generation: it was
        dropped and staged again since); with ``nowait``,
        :class:`~kvstore.errors.WouldBlock` rather than wait, copy down or evict."""
        host, _ = self._host()
        staging = self.staging
        if len(keys) != len(places):
            raise ValueError(f"{len(keys)} hashes but {len(places)} staged places")
        if len(set(places)) != len(places):
            raise ValueError("a staged place is named twice")
        if gens is not None and len(gens) != len(places):
            raise ValueError(f"{len(places)} staged places but {len(gens)} generations")
        if sums is not None and len(sums) != len(places):
            raise ValueError(f"{len(places)} staged places but {len(sums)} checksums")
        sent = dict(zip(places, sums, strict=True)) if sums is not None else None
        self._check_commit(host, nowait)
        staging.check(ns.name, places, owner=owner, gens=gens)
        fresh: list[tuple[BlockKey, int]] = []
        seen: set[BlockKey] = set()
        existing = refused = 0
        # one read of the cold tiers' indexes for the batch, not one per block
        for key, place, entry in zip(keys, places, self._ledger.get_many(keys), strict=True):
            if key in seen or (entry is not None and not entry.pending):
                existing += 1
            elif entry is not None:  # another writer reserved it and has not committed
                refused += 1
            else:
                seen.add(key)
                fresh.append((key, place))
        for (key, _), ext in zip(fresh, staging.claim(ns, fresh, owner=owner), strict=True):
            self._ledger.reserve(key, Entry(ns.block_bytes, None, ns.layout_id))
            self._reservations.add(key, Held(owner, math.inf, ext))
        mine = self._seal([k for k, _ in fresh],
                          None if sent is None else [sent[p] for _, p in fresh])
        self._publish(host, mine)
        self._tally.stored(ns.name, len(mine))
        refused += len(fresh) - len(mine)
        return PutResult(len(mine), existing, refused), [p for _, p in fresh]

    def _seal(self, keys: list[BlockKey], sent: list[int | None] | None,
              landed: list[int | None] | None = None) -> list[BlockKey]:
        """Record each reserved block's checksum (see :meth:`Checks.sealed`); those whose
        bytes differ from the writer's checksum in ``sent`` are unreserved (lock held)."""
        sums = self._checks.sealed([self._held(k).extents for k in keys], sent,
                                   landed or [None] * len(keys))
        for key, csum, entry in zip(keys, sums, self._ledger.get_many(keys), strict=True):
            if csum is None:
                self._reservations.free(key)
            elif entry is not None:
                entry.checksum = csum
        return [k for k, csum in zip(keys, sums, strict=True) if csum is not None]

    def _held(self, key: BlockKey) -> Held:
        held = self._reservations.get(key)
        assert held is not None, key  # callers pass only keys reserved in this lock hold
        return held

    def _check_commit(self, host: int, nowait: bool) -> None:
        """With ``nowait``, refuse a commit that would copy to a write-through tier or evict
        past the high watermark (I/O)."""
        if nowait and (self._stack.writes_through(host) or self._placer.over_high_watermark(host)):
            raise WouldBlock("the commit must copy or evict to a lower tier")

    def _publish(self, host: int, keys: list[BlockKey]) -> None:
        """Make reserved, written blocks visible in the host tier (lock held)."""
        slab = self._stack.slab()
        slab.publish_many(keys)
        for key in keys:
            self._reservations.published(key)
        self._ledger.publish_many(keys, host)
        self._stack.on_access_many(keys)
        if keys and self._stack.writes_through(host):  # copies only when a tier below wants them
            items: list[Item] = []
            for key in keys:
                entry = self._ledger.get(key)
                if entry is not None:
                    meta = BlockMeta(entry.layout_id, entry.checksum, entry.size)
                    items.append((key, slab.read(key), meta))
            self._placer.write_through(host, items)
        self._placer.settle(host)

    # -- deletes, owners, leases -------------------------------------------------------------
    def expire(self, owner: str | None, now: float) -> int:
        """End what has run out by ``now``: reservations (receiving ones are doomed), retired
        slots, and with ``owner`` all it reserved or staged (lock held). How many ended."""
        dropped = self.staging.drop(owner) if owner is not None else 0
        self.deletes.free_retired(now)
        for key in self._reservations.expired(owner, now):
            self._reservations.end(key)
            dropped += 1
        return dropped

    def unreserve_namespace(self, namespace: str) -> None:
        """End every reservation of ``namespace`` (freed, or doomed while the server receives
        into it), whoever holds it: it is being deleted; a late commit is refused (lock held)."""
        for key in self._reservations.of_namespace(namespace):
            self._reservations.end(key)

    def close(self) -> None:
        """Free every reservation, doomed, staged place and retired slot (lock held)."""
        self._reservations.close()
        self.staging.drop_all()
        self.deletes.free_retired(math.inf)

    def reserved(self, key: BlockKey) -> bool:
        return key in self._reservations

    def places(self) -> set[BlockKey]:
        """Every key this path holds reserved in the host slab (lock held)."""
        return {*self._reservations.places(), *self.staging.places(), *self.deletes.places()}

    def _next_ids(self, count: int) -> int:
        """Reserve ``count`` placeholder numbers; returns the last one."""
        self._seq += count
        return self._seq

    def _host(self) -> tuple[int, SlabTier]:
        """The host tier's position and slab; raises :class:`KVStoreError` without one."""
        slab = self._stack.slab()  # raises first
        return int(self._stack.host or 0), slab

