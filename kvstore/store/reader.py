"""Reads: serve blocks from their top tier, verify checksums, promote hits, count them,
prefetch, and index what persistent tiers hold (at start) and shared tiers (S3) know.

Persistent tiers are read outside the store lock, one batched call per tier, with the blocks
marked as being read in the lease table so that they are not evicted meanwhile; their
checksum makes a racing delete harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kvstore.checksum import checksum
from kvstore.errors import WouldBlock
from kvstore.store.counters import Tally
from kvstore.store.exits import Exits
from kvstore.store.index import Entry, check_hashes, fmt_key, make_keys
from kvstore.store.leases import LeaseTable
from kvstore.store.ledger import Ledger
from kvstore.store.lock import StoreLock
from kvstore.store.namespaces import NamespaceBook
from kvstore.store.placer import Placer
from kvstore.store.shared import SharedChanges
from kvstore.store.stack import TierStack
from kvstore.tiers.base import BlockMeta
from kvstore.types import BlockHash, BlockKey, LookupResult

log = logging.getLogger("kvstore.store")


class Reader:
    """Serves reads over the stack. Takes the store lock itself (the caller must not hold
    it): a read leaves it while a persistent tier answers."""

    def __init__(self, stack: TierStack, ledger: Ledger, placer: Placer, exits: Exits,
                 tally: Tally, leases: LeaseTable, lock: StoreLock,
                 namespaces: NamespaceBook, changes: SharedChanges) -> None:
        self._stack = stack
        self._tiers = stack.tiers
        self._ledger = ledger
        self._placer = placer
        self._exits = exits
        self._tally = tally
        self._leases = leases
        self._lock = lock
        self._namespaces = namespaces
        self._changes = changes

    def read(
        self, keys: list[BlockKey], *, promote: bool, count: bool, promote_to: int = 0
    ) -> list[bytes | None]:
        """Bytes of each block from its top tier (None: a miss), verified; hits from below
        ``promote_to`` are copied up into it when ``promote``."""
        out: list[bytes | None] = [None] * len(keys)
        served_by: list[int] = [-1] * len(keys)
        self.discover_missing(keys)
        held: list[Entry] = []  # a disk-only block's entry lives while held: built once
        with self._lock:
            slow: dict[int, list[int]] = {}
            reading: list[BlockKey] = []
            for i, (key, entry) in enumerate(zip(keys, self._ledger.visible_many(keys),
                                                 strict=True)):
                if entry is None:
                    continue
                held.append(entry)
                pos = entry.top()
                if self._tiers[pos].persistent:
                    self._leases.start_read(key)
                    reading.append(key)
                    slow.setdefault(pos, []).append(i)
                else:
                    out[i] = self._tiers[pos].get_many([key])[0]
                    served_by[i] = pos if out[i] is not None else -1
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
            for pos in slow:  # before the checks: a copy the tier lost is dropped once
                self._changes.take(pos)
            for key in reading:
                self._leases.end_read(key)
            entries = [self._check(key, served_by[i], out[i]) if served_by[i] >= 0 else None
                       for i, key in enumerate(keys)]
            for i, entry in enumerate(entries):
                if entry is None:
                    out[i], served_by[i] = None, -1
            # promotions come last: they may evict blocks this same call just read
            for key, pos, entry, data in zip(keys, served_by, entries, out, strict=True):
                if entry is None or data is None:
                    continue
                self._ledger.hit(pos, key)
                if count:
                    self._stack.on_access(key)
                if promote and pos > promote_to:
                    self._promote(key, entry, data, promote_to)
            if count:
                self._tally.reads([k[0] for k in keys], served_by, [d is not None for d in out])
        return out

    def _check(self, key: BlockKey, pos: int, data: bytes | None) -> Entry | None:
        """The entry of a block tier ``pos`` served as ``data``, if that answer stands."""
        entry = self._ledger.get(key)
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
        if tier.verify_reads and checksum(data) != entry.checksum:
            log.error("checksum mismatch for %s in the %s tier: dropped", fmt_key(key), tier.name)
            self._exits.remove(pos, [key])
            if not entry.tiers:
                self._exits.drop(key, entry, left=pos, why="corrupt")
            self._tally.corrupt(pos, key[0])
            return None
        return entry

    def _promote(self, key: BlockKey, entry: Entry, data: bytes, to: int) -> None:
        """Copy a block read from a lower tier into tier ``to`` (the lower copy stays)."""
        # an earlier promotion in the same batch may have cascaded into evicting this block
        if entry.holds(to) or self._ledger.get(key) is not entry:
            return
        meta = BlockMeta(entry.layout_id, entry.checksum, entry.size)
        if self._placer.write(to, [(key, data, meta)]):
            self._ledger.add_copy(to, key, entry)
            self._tally.promoted(to, key[0])
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
        return LookupResult(n, tiers)

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
                if pos in self._changes.positions:
                    found = self._changes.take(pos) or found
                    continue
                for key, meta in zip(keys, metas, strict=True):
                    if meta is None or key in self._ledger:
                        continue
                    if meta.layout_id != self._namespaces.layout_id(key[0]):
                        continue  # unregistered, or stored under another definition
                    self._ledger.add_block(
                        key, Entry(meta.size, meta.checksum, meta.layout_id), pos)
                    found = True
        return found

    def settle(self) -> None:
        """Take what the shared tiers that index themselves adopted or lost on their own (an
        upload dropped in the background is otherwise counted until a read)."""
        with self._lock:
            self._changes.take_all()

    def index_persistent(self) -> None:
        """Index every block the persistent tiers hold (at start, after a restart). Blocks
        whose layout id does not match their registered namespace are skipped: they belong to
        another definition. Shared tiers are not listed: :meth:`discover` asks them; nor are
        tiers that index themselves (disk): the ledger asks them when it needs a block."""
        for pos, tier in enumerate(self._tiers):
            if (not tier.persistent or getattr(tier, "discover", None) is not None
                    or getattr(tier, "indexes_itself", False)):
                continue
            for key, meta in tier.scan():
                layout = self._namespaces.layout_id(key[0])
                if layout is not None and meta.layout_id != layout:
                    log.warning("skipping %s: layout id differs from its namespace", fmt_key(key))
                    continue
                entry = self._ledger.get(key)
                if entry is None:
                    self._ledger.add_block(
                        key, Entry(meta.size, meta.checksum, meta.layout_id), pos)
                else:
                    self._ledger.add_copy(pos, key, entry)
