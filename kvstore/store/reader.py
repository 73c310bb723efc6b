"""Reads: serve blocks from their top tier, verify checksums (every tier's), promote hits,
count them, prefetch, and index what shared tiers (S3) know.

Persistent tiers are read outside the store lock, one batched call per tier, with the blocks
marked as being read in the lease table so that they are not evicted meanwhile; their
checksum makes a racing delete harmless. So the reader is one of the parts that take the
store lock themselves (``kvstore/store/facade.py`` states the rule): its callers must not
hold it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext

from kvstore.checksum import checksums
from kvstore.errors import WouldBlock
from kvstore.store.books import Books
from kvstore.store.index import Entry, check_hashes, fmt_key, make_keys, tops
from kvstore.store.lock import StoreLock
from kvstore.store.placer import Placer
from kvstore.store.stack import TierStack
from kvstore.store.tier_writer import Item
from kvstore.tiers.base import BlockMeta
from kvstore.types import BlockHash, BlockKey, LookupResult

log = logging.getLogger("kvstore.store")
_LOOKUP_CHUNK = 4096  # keys a prefetch looks up per hold of the store lock


class Reader:
    """Serves reads over the stack. Takes the store lock itself, through
    its :class:`~kvstore.store.lock.StoreLock` (the caller must not hold
    it): a read leaves it while a persistent tier answers."""

    def __init__(self, stack: TierStack, books: Books, placer: Placer, lock: StoreLock) -> None:
        self._stack, self._tiers, self._placer, self._lock = stack, stack.tiers, placer, lock
        self._books, self._sizing = books, books.sizing
        self._ledger, self._tally, self._leases = books.ledger, books.tally, books.leases
        self._exits, self._checks, self._drift = books.exits, books.checks, books.drift

    def read(
        self, keys: list[BlockKey], *, promote: bool, count: bool, promote_to: int = 0,
        counted_by_caller: bool = False,
    ) -> list[bytes | None]:
        """Bytes of each block from its top tier (None: a miss), verified; hits from below
        ``promote_to`` are copied up into it when ``promote``. ``count``: count the read in
        the stats and the what-if trackers; ``counted_by_caller``: the caller does (its
        promotions are then not fed to the trackers either)."""
        out: list[bytes | None] = [None] * len(keys)
        served_by: list[int] = [-1] * len(keys)
        self.discover_missing(keys)
        with self._lock:
            held = self._ledger.visible_many(keys)  # a disk-only block's entry lives while held
            fast: dict[int, list[int]] = {}  # memory tiers, read under the lock
            slow: dict[int, list[int]] = {}
            for i, pos in enumerate(tops(held)):
                if pos >= 0:
                    (slow if self._tiers[pos].persistent else fast).setdefault(pos, []).append(i)
            for pos, idxs in fast.items():
                for i, data in zip(idxs, self._tiers[pos].get_many([keys[i] for i in idxs]),
                                   strict=True):
                    out[i], served_by[i] = data, pos if data is not None else -1
            reading = [keys[i] for idxs in slow.values() for i in idxs]
            self._leases.start_reads(reading)
        for pos, idxs in slow.items():
            try:
                datas = self._tiers[pos].get_many([keys[i] for i in idxs])
            except Exception as exc:  # a failing back end is a miss, never an error to callers
                log.warning("%s tier read failed: %s", self._stack.names[pos], exc)
                datas = [None] * len(idxs)
            for i, data in zip(idxs, datas, strict=True):
                out[i] = data
                served_by[i] = pos
        with self._lock:
            for pos in self._drift.positions.intersection(slow):
                self._drift.take(pos)  # before the checks: a copy S3 lost is dropped once
            self._leases.end_reads(reading)
            self._drift.sweep()  # before the checks: a block on a damaged page is corrupt
            entries = self._checked(keys, served_by, out)
            hits: dict[int, list[int]] = {}  # tier -> the blocks it served
            for i, entry in enumerate(entries):
                if entry is None or out[i] is None:
                    out[i], served_by[i] = None, -1
                else:
                    hits.setdefault(served_by[i], []).append(i)
            for pos, idxs in hits.items():
                self._ledger.hits(pos, [keys[i] for i in idxs])
            if count:
                self._stack.on_access_many([k for k, d in zip(keys, out, strict=True)
                                            if d is not None])
                self._sizing.reads(keys, served_by)
            if promote:  # promotions come last: they may evict blocks this same call just read
                # after a counted read the read made them the most recent there already
                quiet = count or counted_by_caller
                with self._sizing.muted(promote_to) if quiet else nullcontext():
                    self._promote([i for pos, idxs in hits.items() if pos > promote_to
                                   for i in idxs], keys, entries, out, promote_to)
            if count:
                self._tally.reads([k[0] for k in keys], served_by, [d is not None for d in out])
        return out

    def _checked(self, keys: list[BlockKey], served_by: list[int],
                 out: list[bytes | None]) -> list[Entry | None]:
        """:meth:`_check` of each block served (None for the others), the entries read and
        the checksums of the tiers that verify computed as one batch each."""
        # every tier: memory tiers too (the host slab is shared memory a client may write)
        verify = [pos >= 0 and data is not None for pos, data in zip(served_by, out, strict=True)]
        sums = iter(checksums([d for d, v in zip(out, verify, strict=True) if v and d is not None]))
        return [self._check(key, pos, data, entry, next(sums) if v else None) if pos >= 0
                else None for key, pos, data, entry, v in zip(
                    keys, served_by, out, self._ledger.get_many(keys), verify, strict=True)]

    def _check(self, key: BlockKey, pos: int, data: bytes | None, entry: Entry | None,
               csum: int | None) -> Entry | None:
        """The entry of a block tier ``pos`` served as ``data`` (``csum`` its checksum where
        the tier verifies reads), if that answer stands. ``entry`` is the block's entry now."""
        tier = self._tiers[pos]
        if data is None and entry is not None and entry.holds(pos) and not tier.contains(key):
            # the tier lost it behind our back (an S3 upload dropped after retries, an object
            # deleted by another node): forget that copy
            self._exits.remove(pos, [key])
            if not entry.tiers:
                self._exits.drop(key, entry, left=pos, why="lost")
                self._tally.lost(key[0])
        # a persistent-tier read ran unlocked: the block may have left meanwhile (memory-tier
        # reads ran under the lock and are valid as read)
        if entry is None or data is None or (tier.persistent and not entry.holds(pos)):
            return None
        if not tier.verify_reads and entry.checksum is not None and csum != entry.checksum:
            self._checks.drop(pos, [key], "read")  # a memory copy: the block goes
            return None
        if tier.verify_reads and csum != entry.checksum:
            log.error("checksum mismatch for %s in the %s tier: dropped", fmt_key(key), tier.name)
            self._exits.remove(pos, [key])
            if not entry.tiers:
                self._exits.drop(key, entry, left=pos, why="corrupt")
            self._tally.corrupt(pos, key[0], "read")
            return None
        return entry

    def _promote(self, idxs: list[int], keys: list[BlockKey], entries: list[Entry | None],
                 datas: list[bytes | None], to: int) -> None:
        """Copy blocks read from lower tiers into tier ``to`` (the lower copies stay), as one
        batch where it fits (:meth:`~kvstore.store.placer.Placer.copy_batch`)."""
        items: dict[BlockKey, Item] = {}  # a block read twice is copied once
        now = self._ledger.get_many([keys[i] for i in idxs])
        for i, current in zip(idxs, now, strict=True):
            entry, data = entries[i], datas[i]
            # it was deleted or replaced meanwhile; one a concurrent read promoted since is
            # left alone by copy_batch (a second copy would give away a granted reader's slots)
            if entry is not None and data is not None and current is entry:
                items[keys[i]] = (keys[i], data,
                                  BlockMeta(entry.layout_id, entry.checksum, entry.size))
        if not items:
            return
        self._placer.copy_batch(to, list(items.values()), settle=False)
        # the room a copy made may have evicted other blocks of the batch: count what holds
        self._tally.promoted_many(to, [k[0] for k, _ in self._ledger.holding(to, list(items))])
        self._placer.settle(to)

    def lookup(self, namespace: str, hashes: Sequence[BlockHash], *,
               nowait: bool = False) -> LookupResult:
        """Longest stored prefix of ``hashes`` and the top tier of each of its blocks, asking
        shared tiers about the rest of the chain; see ``Store.lookup``."""
        # Only bytes are ever indexed, so a hit proves its hash valid; the tail after the
        # first miss is validated here.
        with self._lock.hold(nowait):
            tiers = self._ledger.prefix(namespace, hashes)
        n = len(tiers)
        if n < len(hashes):
            if check_hashes(hashes[n:]):
                return self.lookup(namespace, [BlockHash(bytes(h)) for h in hashes],
                                   nowait=nowait)
            if self._stack.shared:
                if nowait:
                    raise WouldBlock("the rest of the chain must be looked up in S3")
                if self.discover(make_keys(namespace, hashes[n:]), prefix=True):
                    return self.lookup(namespace, hashes)
            if self._sizing.enabled:
                with self._lock.hold(nowait):
                    self._sizing.missed(namespace, hashes[n:])
        return LookupResult(n, tiers)

    def to_prefetch(self, keys: list[BlockKey], *, nowait: bool) -> tuple[list[BlockKey], int]:
        """What a prefetch of ``keys`` has to do: the distinct blocks stored below the top
        tier (unknown hashes and blocks on top are not queued), and how many are on top
        already. With ``nowait``, raises :class:`~kvstore.errors.WouldBlock` rather than
        wait for the lock."""
        keys = list(dict.fromkeys(keys))
        entries = [e for run in self._lock.scan(keys, _LOOKUP_CHUNK, self._ledger.visible_many,
                                                 nowait=nowait) for e in run]
        todo = [k for k, e in zip(keys, entries, strict=True) if e is not None and not e.holds(0)]
        return todo, sum(e is not None and e.holds(0) for e in entries)

    def prefetch(self, keys: list[BlockKey]) -> int:
        """Promote blocks into the top tier; how many of ``keys`` it holds afterwards."""
        with self._lock:
            todo = [k for k, e in zip(keys, self._ledger.visible_many(keys), strict=True)
                    if e is not None and not e.holds(0)]
        if todo:
            datas = self.read(todo, promote=True, count=False)
            with self._lock:
                self._tally.prefetched([k[0] for k, d in zip(todo, datas, strict=True)
                                        if d is not None])
        with self._lock:
            return sum(1 for e in self._ledger.get_many(keys) if e is not None and e.holds(0))

    def discover_missing(self, keys: Sequence[BlockKey]) -> None:
        """Ask shared tiers (S3) about those of ``keys`` missing from the index."""
        if self._stack.shared:
            missing = [k for k in keys if k not in self._ledger]
            if missing:
                self.discover(missing)

    def discover(self, keys: Sequence[BlockKey], *, prefix: bool = False) -> bool:
        """Ask shared tiers (S3) about keys missing from the index, and index what they hold.
        With ``prefix`` the keys are a hash chain and the tier may stop asking after the first
        miss. True if anything was found."""
        found = False
        for pos, tier in self._stack.shared:
            try:
                metas = tier.discover(list(keys), prefix=prefix)
            except Exception as exc:
                log.warning("%s discover failed: %s", tier.name, exc)
                continue
            with self._lock:
                if pos in self._drift.positions:
                    found = self._drift.take(pos) or found
                    continue
                for key, meta in zip(keys, metas, strict=True):
                    if meta is None or key in self._ledger:
                        continue
                    if meta.layout_id != self._books.layout_of(key[0]):
                        continue  # unregistered, or stored under another definition
                    self._ledger.add_block(
                        key, Entry(meta.size, meta.checksum, meta.layout_id), pos)
                    found = True
        return found
