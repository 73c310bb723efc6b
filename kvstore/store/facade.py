"""The store: one facade over parts that each own a piece of its state (the table is in
``docs/store_api.md``, "Inside the store").

The lock rule. The store lock (:class:`~kvstore.store.lock.StoreLock`, over every part's
records and the memory tiers' copies) is taken by the facade: each method below holds it
(``with self._lock``, or ``self._lock.hold(nowait)``) around its calls into the parts, and
no part takes it, except the three that must let it go while a persistent tier (disk, S3)
answers: the ``Reader``, ``HostPath.acquire_read`` (it promotes through the reader) and the
``Demoter`` (its own thread). The facade calls those without it; they take it themselves,
only through the ``StoreLock`` they are given (``with lock``, ``lock.hold(nowait)``;
``lock.scan``: one hold per run of a long scan), never across a tier's call. The namespace
book and the prefetch queue have locks of their own and never take the store's.

The store's invariants are stated with their check, in :mod:`kvstore.store.report`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

from kvstore.config import StoreConfig
from kvstore.errors import UnknownNamespaceError
from kvstore.namespace import Namespace
from kvstore.protocol.health import StoreHealth
from kvstore.protocol.stats import StoreStats
from kvstore.store.index import make_keys
from kvstore.store.parts import Parts
from kvstore.store.placement import NamespaceClaims, PlacementSink
from kvstore.store.report import TRACE_CHUNK
from kvstore.tiers import Tier
from kvstore.tiers.base import Buffer
from kvstore.tiers.slab import SlabInfo, SlabShare
from kvstore.tiers.slots import Fenced, FencedPlaces, Granted
from kvstore.types import BlockHash, BlockKey, CorruptCause, LookupResult, PutResult, Trace
from kvstore.whatif import Curve
from kvstore.whatif.advice import Advice


class Store:
    """Tiered block store. ``docs/store_api.md`` is the method table."""

    def __init__(self, config: StoreConfig, tiers: Sequence[Tier] | None = None) -> None:
        self.config = config
        parts = Parts.build(config, tiers)
        self._stack, self._lock, self._book = parts.stack, parts.lock, parts.book
        self._books, self._placer, self._reader = parts.books, parts.placer, parts.reader
        self._host, self._report, self._life = parts.host, parts.report, parts.life
        self._ledger, self._leases = self._books.ledger, self._books.leases
        self._claims: NamespaceClaims | None = None  # see watch_namespaces
        with self._lock:
            for ns in self._book.load():
                self._books.registered(ns)
            self._books.index_persistent()

    def settled(self, timeout: float | None = None) -> bool:
        """Wait until background demotion is idle (at once without it); False on timeout."""
        return self._life.settled(timeout)

    # -- namespaces --------------------------------------------------------------------------
    def register_namespace(self, ns: Namespace) -> bool:
        """Register ``ns``: True if new, False if identical (``NamespaceConflictError``,
        ``NamespaceLimitError``); the cluster, if any, is asked first. Takes no store lock."""
        if self._claims is not None:
            self._claims.claim(ns)
        new = self._book.register(ns)
        if new:
            with self._lock:
                self._books.registered(ns)
        return new

    def delete_namespace(self, name: str) -> int:
        """Forget ``name`` and delete its blocks; how many. Calls naming it fail at once; if
        the delete fails, the namespace is back (less what went) and the error raised."""
        ns = self._book.unlist(name)
        try:
            with self._lock:
                self._host.unreserve_namespace(name)
                dropped = self._host.deletes.delete_blocks(self._ledger.keys_of(name),
                                                           remember=False)
                self._books.forget_namespace(name)
        except BaseException:
            self._book.relist(ns)
            raise
        self._book.save()
        if self._claims is not None:
            self._claims.release(name)
        return dropped

    def namespace(self, name: str) -> Namespace:
        """The registered namespace ``name`` (``UnknownNamespaceError``); takes no lock."""
        return self._book.get(name)

    def namespaces(self) -> list[Namespace]:
        return self._book.all()

    # -- data path ---------------------------------------------------------------------------
    def put(self, namespace: str, hashes: Sequence[BlockHash], blocks: Sequence[Buffer], *,
            tier: str | None = None, sums: Sequence[int | None] | None = None) -> PutResult:
        """Store blocks (``block_bytes`` each) in the top tier or ``tier``: stored already,
        ``existing``; no room (all pinned) or bytes unlike ``sums``, ``refused``. Raises on a
        bad namespace, size or hash before storing anything."""
        ns = self.namespace(namespace)  # then, without the lock, room the demoter frees:
        start, items, bad = self._life.make_way(self._placer.writer.new_items(ns, hashes, blocks,
                                                                             tier, sums))
        with self._lock:
            self._life.check_open()
            if self._book.layout_id(namespace) != ns.layout_id:  # deleted meanwhile
                raise UnknownNamespaceError(f"unknown namespace {namespace!r}")
            result = self._placer.put(items, start, named_tier=tier is not None)
            self._books.tally.stored(namespace, result.stored)
            return result._replace(refused=result.refused + bad) if bad else result

    def get(self, namespace: str, hashes: Sequence[BlockHash], *,
            promote: bool | None = None) -> list[bytes | None]:
        """Each block's bytes or None (absent, or dropped for its checksum); a hit below goes
        up if ``promote`` (default ``promote_on_hit``)."""
        _, keys = self._book.keys(namespace, hashes)
        self._life.check_open()
        do_promote = self.config.promote_on_hit if promote is None else promote
        return self._reader.read(keys, promote=do_promote, count=True)

    def contains(self, namespace: str, block_hash: BlockHash) -> bool:
        key = make_keys(namespace, [block_hash])[0]
        with self._lock:
            return self._ledger.visible(key) is not None

    def lookup(self, namespace: str, hashes: Sequence[BlockHash], *,
               nowait: bool = False) -> LookupResult:
        """Longest stored prefix and each block's top tier (``nowait``: ``WouldBlock`` rather
        than wait for the lock or ask S3)."""
        self.namespace(namespace)
        return self._reader.lookup(namespace, hashes, nowait=nowait)

    def trace(self, namespace: str, hashes: Sequence[BlockHash]) -> Trace:
        """Every tier holding each block (top first), and the ghost of each departed one
        (when, from which tier, why) while kept. No side effects; asks S3 what is missing."""
        _, keys = self._book.keys(namespace, hashes)
        self._reader.discover_missing(keys)
        chunks = list(self._lock.scan(keys, TRACE_CHUNK, self._report.where))
        with self._lock:
            return self._report.trace(chunks)

    def delete(self, namespace: str, hashes: Sequence[BlockHash]) -> int:
        """Remove blocks from every tier, pinned or not (a pinned one's host slots stay,
        unreadable, until its pins end); how many existed."""
        _, keys = self._book.keys(namespace, hashes)
        with self._lock:
            return self._host.deletes.delete_blocks(keys)

    def prefetch(self, namespace: str, hashes: Sequence[BlockHash], *,
                 nowait: bool = False) -> Future[int]:
        """Onboard the blocks held below the top tier; the future gives the distinct blocks
        on top when done. ``BusyError`` (none queued) past ``max_prefetch_blocks``;
        ``nowait``: ``WouldBlock`` rather than wait for the store lock."""
        ns, keys = self._book.keys(namespace, hashes)
        todo, done = self._reader.to_prefetch(keys, nowait=nowait)
        return self._life.prefetch(self._reader.prefetch, todo, block_bytes=ns.block_bytes,
                                   done=done)

    # -- pins --------------------------------------------------------------------------------
    def pin(self, namespace: str, hashes: Sequence[BlockHash], *, lease_s: float | None = None,
            owner: str = "", tenant: str | None = None) -> list[bool]:
        """Pin existing blocks for ``lease_s`` s; True where pinned. Charged to ``tenant``
        (``PinQuotaError``, pinning nothing, past its quota)."""
        ns, keys = self._book.keys(namespace, hashes)
        with self._lock:
            live = [e is not None for e in self._ledger.visible_many(keys)]
            self._leases.pin_many([k for k, ok in zip(keys, live, strict=True) if ok], owner,
                                  self._leases.term(lease_s), size=ns.block_bytes, tenant=tenant)
        return live

    def release(self, namespace: str, hashes: Sequence[BlockHash], *, owner: str = "",
                nowait: bool = False) -> int:
        """Drop ``owner``'s pins on ``hashes``; how many it held. ``nowait``: as lookup."""
        with self._lock.hold(nowait):
            return self._leases.release_many(make_keys(namespace, hashes), owner)

    def expire_leases(self, owner: str | None = None) -> int:
        """Drop expired pins and reservations, or all of ``owner``'s (staged places too)."""
        with self._lock:
            return self._leases.expire(owner) + self._host.expire(owner, time.monotonic())

    def cut_leases(self, owner: str, within_s: float) -> int:
        """``owner``'s pins end within ``within_s`` s (0: now); how many. Places stay."""
        with self._lock:
            return self._leases.cut(owner, max(0.0, within_s))

    # -- the shared-memory path: contracts on kvstore.store.host_path.HostPath --------------
    def host_slab(self) -> SlabInfo | None:
        """``SlabInfo(shm_name, size, slot_bytes)`` of the host tier, or None without one."""
        return None if self._stack.host is None else self._stack.slab().slab_info()

    def acquire_read(self, namespace: str, hashes: Sequence[BlockHash], *,
                     lease_s: float | None = None, owner: str = "", nowait: bool = False,
                     promote: bool = True, tenant: str | None = None) -> Granted:
        """Pinned host-slab extents (None: a miss), generations and checksums; as :meth:`pin`."""
        self._stack.slab()
        ns, keys = self._book.keys(namespace, hashes)
        return self._host.acquire_read(keys, lease=self._leases.term(lease_s), owner=owner,
                                       nowait=nowait, promote=promote, size=ns.block_bytes,
                                       tenant=tenant)

    def reserve_write(self, namespace: str, hashes: Sequence[BlockHash], *,
                      lease_s: float | None = None, owner: str = "",
                      nowait: bool = False, receiving: bool = False) -> Fenced:
        """Host-slab extents (None: skip) and generations for each new block; ``receiving``:
        the caller always commits or aborts, so a delete or expiry only dooms them."""
        self._stack.slab()
        ns, keys = self._book.keys(namespace, hashes)
        expiry = time.monotonic() + self._leases.term(lease_s)
        self._life.open_with_room(ns.block_bytes, len(keys), nowait)
        with self._lock.hold(nowait):
            return self._host.reserve_write(ns, keys, expiry=expiry, owner=owner,
                                            nowait=nowait, receiving=receiving)

    def commit_write(self, namespace: str, hashes: Sequence[BlockHash], *, owner: str = "",
                     nowait: bool = False, gens: Sequence[int | None] | None = None,
                     sums: Sequence[int | None] | None = None,
                     landed: Sequence[int | None] | None = None) -> PutResult:
        """Publish what this owner reserved and wrote, refusing moved slots (``gens``) and
        bytes unlike ``sums`` (``landed``: as they landed, else hashed now)."""
        self._stack.slab()
        keys = make_keys(namespace, hashes)
        with self._lock.hold(nowait):
            return self._host.commit_write(keys, owner=owner, nowait=nowait, gens=gens,
                                           sums=sums, landed=landed)

    def abort_write(self, namespace: str, hashes: Sequence[BlockHash], *,
                    owner: str = "") -> int:
        """Free this owner's reservations for ``hashes``; how many were freed."""
        self._stack.slab()
        keys = make_keys(namespace, hashes)
        with self._lock:
            return self._host.abort_write(keys, owner=owner)

    def stage_write(self, namespace: str, count: int, *, owner: str = "",
                    nowait: bool = False) -> FencedPlaces:
        """Up to ``count`` staged places for blocks of ``namespace``, with generations."""
        self._stack.slab()
        ns = self.namespace(namespace)
        self._life.check_open()
        with self._lock.hold(nowait):
            return self._host.stage_write(ns, count, owner=owner, nowait=nowait)

    def commit_staged(self, namespace: str, hashes: Sequence[BlockHash], places: Sequence[int],
                      *, owner: str = "", nowait: bool = False,
                      gens: Sequence[int | None] | None = None,
                      sums: Sequence[int | None] | None = None) -> tuple[PutResult, list[int]]:
        """Publish ``hashes[i]`` written at staged ``places[i]`` (checked: ``gens``, ``sums``)."""
        self._stack.slab()
        ns, keys = self._book.keys(namespace, hashes)
        with self._lock.hold(nowait):
            return self._host.commit_staged(ns, keys, places, owner=owner, nowait=nowait,
                                            gens=gens, sums=sums)

    def check_host(self, namespace: str, hashes: Sequence[BlockHash],
                   cause: CorruptCause = "client") -> int:
        """Hash the host copies where they lie, dropping those that fail; how many."""
        _, keys = self._book.keys(namespace, hashes)
        with self._lock:
            return self._books.checks.check_host(keys, cause)

    def host_share(self) -> SlabShare | None:
        """The host slab's fd and layout (for ``SCM_RIGHTS``); None without one to share."""
        return self._stack.slab_share()

    # -- reports, placement (what a cluster node publishes) and lifecycle --------------------
    def stats(self) -> StoreStats:
        with self._lock:
            return self._report.stats()

    def health(self) -> StoreHealth:
        return self._report.health(self._life.closed)

    def whatif(self, tier: str, namespaces: Sequence[str] | None = None,
               policy: str | None = None) -> Curve:
        """``tier``'s hit rate at capacities around today's for ``namespaces`` (None: all)
        under ``policy`` (None: its own); ``LookupError``: no such tier or curves off,
        ``ValueError``: a policy not simulated (:mod:`kvstore.store.sizing`)."""
        with self._lock:
            return self._books.sizing.curve(tier, namespaces, policy)

    def advise(self, tier: str, namespaces: Sequence[str] | None = None,
               policy: str | None = None, prefill_tokens_per_s: float | None = None) -> Advice:
        """:meth:`whatif`'s curve and what larger capacities would save an hour at today's
        traffic (:mod:`kvstore.whatif.advice`); errors as :meth:`whatif`."""
        with self._lock:
            return self._books.sizing.advise(tier, namespaces, policy, prefill_tokens_per_s)

    def reset_whatif(self) -> None:
        """Start every tier's curves again from now."""
        with self._lock:
            self._books.sizing.reset()

    def check_integrity(self) -> None:
        """Raise :class:`~kvstore.store.report.IntegrityError` if the index, the tiers and the
        policies disagree or a capacity is exceeded (S3's own changes settled first)."""
        with self._lock:
            self._report.check_integrity()

    def tier_names(self) -> list[str]:
        return list(self._stack.names)

    def watch_placement(self, sink: PlacementSink | None) -> None:
        """Tell ``sink`` of every change in where blocks lie from now on (None: no one)."""
        with self._lock:
            self._ledger.sink = sink

    def watch_namespaces(self, claims: NamespaceClaims | None) -> None:
        """Ask ``claims`` before each registration and tell it of each namespace deleted."""
        self._claims = claims

    def placements(self, chunk: int = 4096) -> Iterator[list[tuple[BlockKey, int]]]:
        """Every published block with its tier mask, ``chunk`` blocks at a time."""
        for ns in self._book.all():
            with self._lock:
                keys = self._ledger.keys_of(ns.name)
            for i, run in enumerate(self._lock.scan(keys, chunk, self._ledger.visible_many)):
                part = keys[i * chunk:(i + 1) * chunk]
                yield [(k, e.tiers) for k, e in zip(part, run, strict=True) if e is not None]

    def tier(self, name: str) -> Tier:
        return self._stack.tiers[self._stack.pos(name)]

    def flush(self) -> None:
        with self._lock:
            self._life.flush()

    def close(self) -> int:
        """Stop prefetches and the demoter, free the host path, spill memory-only blocks
        (``spill_on_close``), close the tiers; how many the spill lost (0 again). Idempotent."""
        with self._lock:
            if not self._life.closing():
                return 0
        self._life.stop()  # without the lock: the demoter's batch in flight lands under it
        with self._lock:
            return self._life.shut()

    @property
    def spilled(self) -> int:
        """Memory-only blocks :meth:`close` wrote to the persistent tier (0 before it)."""
        return self._life.spilled

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
