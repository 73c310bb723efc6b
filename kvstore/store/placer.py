"""Placement and eviction: where a new block goes, how a tier makes room (demoting its victims
down the stack a batch at a time: one read from the tier they leave and one write, one LMDB
transaction, into the tier below), write-through copies, and the spill to disk on close.

Every method expects the store lock to be held. Every block has its checksum from the moment
it is acknowledged; a demotion or a spill checks the bytes it copies down against it
(:mod:`kvstore.store.verify`) and passes it on, never computing a new one over bytes that may
have changed in memory. Blocks leave through :mod:`kvstore.store.exits`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from itertools import accumulate

from kvstore.checksum import checksum
from kvstore.store.books import Books
from kvstore.store.index import Entry, make_entries
from kvstore.store.stack import TierStack
from kvstore.store.tier_writer import Item, TierWriter
from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.types import BlockKey, PutResult

log = logging.getLogger("kvstore.store")
MAX_DEMOTE_BATCH = 256  # victims moved down in one read and one write at most


class Placer:
    """Writes blocks into tiers and evicts them. Owns its
    :class:`~kvstore.store.tier_writer.TierWriter` (``writer``: every tier write goes through
    it) and no records: it changes the books' ledger and counters through their methods, asks
    the leases which blocks may go, takes blocks out through the exits."""

    def __init__(self, stack: TierStack, books: Books) -> None:
        self._stack, self._tiers = stack, stack.tiers
        self._ledger, self._tally, self._leases = books.ledger, books.tally, books.leases
        self._exits, self._drift, self._checks = books.exits, books.drift, books.checks
        self.writer = TierWriter(stack, books.ledger)
        # tier -> what settles it in the background (kvstore.store.demoter) instead of here
        self.settlers: dict[int, Callable[[], None]] = {}

    # -- new blocks --------------------------------------------------------------------------
    def put(self, items: list[Item], start: int, named_tier: bool) -> PutResult:
        """Store new blocks in tier ``start`` (or the first tier below it that takes them).
        Blocks already stored are ``existing``; with ``named_tier`` (the caller asked for
        ``start``, for example a durable put to disk) an existing block that ``start`` does not
        hold yet gets a copy there. Blocks no tier can take are ``refused``."""
        fresh: list[Item] = []
        seen: set[BlockKey] = set()
        existing = refused = 0
        keys = [key for key, _, _ in items]
        self._stack.on_access_many(keys)
        copied = False  # a copy made room: the entries read before it may be gone
        for (key, block, meta), entry in zip(items, self._ledger.get_many(keys), strict=True):
            if copied:
                entry = self._ledger.get(key)
            if (entry is not None and not entry.pending) or key in seen:
                existing += 1
                if named_tier and entry is not None and not entry.tiers >> start:
                    self._copy_down(key, entry, block, meta.checksum, start)
                    copied = True
                continue
            if entry is not None:  # reserved by a shm writer that has not committed
                refused += 1
                continue
            seen.add(key)
            fresh.append((key, block, meta))
        admits = start == 0 or all(self._stack.admissions[start].admit_many(
            [k for k, _, _ in fresh]))
        rest = self._place_batch(fresh, start) if admits else fresh
        stored = len(fresh) - len(rest)
        for item in rest:  # one by one: each may land in a different tier
            if self._place(item, start):
                stored += 1
            else:
                refused += 1
                self._tally.ns(item[0][0]).dropped += 1
        return PutResult(stored, existing, refused)

    def _place_batch(self, items: list[Item], pos: int) -> list[Item]:
        """Store a whole batch in tier ``pos`` with one ``put_many`` (the common case: the top
        tier makes room by demoting). Returns the items it did not store: all of them if the
        batch does not fit as a whole."""
        if not items or not self.write(pos, items):
            return items
        self._ledger.add_blocks(pos, list(zip([k for k, _, _ in items],
                                              make_entries([m for _, _, m in items]), strict=True)))
        self.write_through(pos, items)
        self.settle(pos)
        return []

    def _place(self, item: Item, start: int) -> bool:
        """Store a new block in the first tier at or below ``start`` that admits it and can make
        room; also into write-through tiers below. False if no tier could take it."""
        key = item[0]
        for pos in range(start, len(self._tiers)):
            if pos > start and not self._stack.admissions[pos].admit(key):
                continue
            one = [item]
            if self.write(pos, one):
                meta = one[0][2]  # write may have added the checksum
                self._ledger.add_block(key, Entry(meta.size, meta.checksum, meta.layout_id), pos)
                self.write_through(pos, one)
                self.settle(pos)
                return True
        return False

    def write_through(self, pos: int, items: list[Item]) -> None:
        """Copy blocks that tier ``pos`` just took into the write-through tiers below it."""
        for low in range(pos + 1, len(self._tiers)):
            if self._stack.configs[low].write_through:
                oks = self._stack.admissions[low].admit_many([k for k, _, _ in items])
                self.copy_batch(low, [it for it, ok in zip(items, oks, strict=True) if ok])

    def copy_batch(self, pos: int, items: list[Item], *, settle: bool = True) -> set[BlockKey]:
        """Give indexed blocks a copy in tier ``pos``, as one batch where it fits as a whole,
        else one by one. Returns the keys that tier did not take; a block it holds already is
        left as it is and counts as taken."""
        # Never over a block's own copy: put_many frees a replaced key's slots, pinned or not,
        # for its batch's other blocks, and a pinned copy is being read (a socket get sends the
        # slots as they are). Every path that copies an indexed block into a tier comes here.
        held = {key for key, _ in self._ledger.holding(pos, [key for key, _, _ in items])}
        items = [it for it in items if it[0] not in held]
        if not items:
            return set()
        if not self.write(pos, items):
            if len(items) == 1:
                return {items[0][0]}
            return {k for it in items for k in self.copy_batch(pos, [it], settle=settle)}
        keys = [key for key, _, _ in items]
        entries = self._ledger.get_many(keys)
        self._ledger.add_copies(pos, [(k, e) for k, e in zip(keys, entries, strict=True)
                                      if e is not None])
        gone = [k for k, e in zip(keys, entries, strict=True) if e is None]
        if gone:  # evicted by the room this very write made: do not leak the copies
            self._tiers[pos].delete(gone)
        if settle:
            self.settle(pos)
        return set()

    def _copy_down(
        self, key: BlockKey, entry: Entry, data: Buffer, csum: int | None, pos: int
    ) -> None:
        """Give an existing block a copy in tier ``pos`` (a put that names a tier, such as a
        durable put to disk, of a block that memory tiers hold). The caller's bytes are used
        only if they are the bytes we hold."""
        top: bytes | None = None
        if entry.checksum is None:  # held by memory tiers only: hash what they hold
            top = self._tiers[entry.top()].get_many([key])[0]
            if top is None:
                return
            entry.checksum = checksum(top)
        if (checksum(data) if csum is None else csum) != entry.checksum:
            if top is None:
                top = self._tiers[entry.top()].get_many([key])[0]
            if top is None or checksum(top) != entry.checksum:
                return
            data = top
        self.copy_batch(pos, [(key, data, BlockMeta(entry.layout_id, entry.checksum, entry.size))])

    # -- writing and making room -------------------------------------------------------------
    def write(self, pos: int, items: list[Item]) -> bool:
        """Make room in tier ``pos`` and write ``items`` (:meth:`TierWriter.put`, which fills
        in checksums where the tier keeps them); False if it cannot."""
        tier = self._tiers[pos]
        need = sum(tier.charges([m.size for _, _, m in items]))
        if need > tier.capacity_bytes or not self.make_room(pos, need):
            return False
        return self.writer.put(pos, items)

    def make_room(self, pos: int, need: int) -> bool:
        """Evict from tier ``pos`` until ``need`` more bytes fit under its capacity."""
        tier = self._tiers[pos]
        over = tier.used_bytes() + need - tier.capacity_bytes
        return over <= 0 or self._evict(pos, over)

    def fits_now(self, pos: int, need: int) -> bool:
        """Whether ``need`` more bytes fit in tier ``pos`` without evicting."""
        tier = self._tiers[pos]
        return tier.used_bytes() + need <= tier.capacity_bytes

    def over_high_watermark(self, pos: int) -> bool:
        tier = self._tiers[pos]
        return tier.used_bytes() > self._stack.configs[pos].high_watermark * tier.capacity_bytes

    def settle(self, pos: int) -> None:
        """Past the high watermark, evict down to the low watermark (or have the tier's
        background settler do it)."""
        if self.over_high_watermark(pos):
            settler = self.settlers.get(pos)
            if settler is not None:
                settler()
                return
            tier = self._tiers[pos]
            low = int(self._stack.configs[pos].low_watermark * tier.capacity_bytes)
            self._evict(pos, tier.used_bytes() - low)

    # -- eviction ----------------------------------------------------------------------------
    def _evict(self, pos: int, nbytes: int) -> bool:
        """Move victims out of tier ``pos`` until ``nbytes`` are freed, a batch at a time.
        False if fewer could be (what is left is pinned or being read)."""
        tier = self._tiers[pos]
        if pos in self._drift.positions:  # what S3 adopted is counted before it is a victim
            self._drift.take(pos)
        freed, used = 0, tier.used_bytes()
        while freed < nbytes:
            resident = self._ledger.resident(pos)
            each = used / resident if resident else 1.0
            want = min(MAX_DEMOTE_BATCH, max(1, math.ceil((nbytes - freed) / max(each, 1.0))))
            victims = self._ledger.victims(pos, want, self._leases.evictable)
            if not victims:
                return False
            victims, entries = self._enough(pos, victims, nbytes - freed)
            self.demote(pos, victims, entries)
            after = tier.used_bytes()
            if after >= used:  # nothing left the tier: never loop on it
                log.warning("eviction from the %s tier freed nothing (%d victims)",
                            self._stack.names[pos], len(victims))
                return False
            freed, used = freed + used - after, after
        return True

    def _enough(self, pos: int, victims: list[BlockKey],
                nbytes: int) -> tuple[list[BlockKey], list[Entry | None]]:
        """The shortest prefix of ``victims`` whose copies in tier ``pos`` free ``nbytes``, with
        their entries (sizes differ between namespaces: the batch was sized on their mean)."""
        found = self._ledger.get_many(victims)
        sizes = [0 if e is None else e.size for e in found]
        for n, total in enumerate(accumulate(self._tiers[pos].charges(sizes)), 1):
            if total >= nbytes:
                return victims[:n], found[:n]
        return victims, found

    def demote(self, pos: int, keys: list[BlockKey],
               found: list[Entry | None] | None = None) -> None:
        """Take ``keys`` out of tier ``pos`` now, counted as evicted: keep each in a lower tier
        (copying it down, in one batch per lower tier, if no lower tier holds it yet and one
        admits it), else drop it from the store. ``found``: their entries, if read already."""
        self._tally.evicted(pos, len(keys))
        if found is None:
            found = self._ledger.get_many(keys)
        entries = [(k, e) for k, e in zip(keys, found, strict=True) if e is not None]
        kept = [k for k, _ in entries]
        lows = range(pos + 1, len(self._tiers))
        # per lower tier, whether it admits each block (asking changes nothing: asked once)
        oks = [self._stack.admissions[low].admit_many(kept) for low in lows]
        alone = [i for i, (_, e) in enumerate(entries)
                 if not e.tiers >> (pos + 1) and any(ok[i] for ok in oks)]
        bad: set[BlockKey] = set()
        if alone:
            datas = self._tiers[pos].get_many([kept[i] for i in alone])
            # the recorded checksum goes down with the bytes: they must still match it
            good = self._checks.matches([entries[i][1].checksum for i in alone], datas)
            bad = {kept[i] for i, d, ok in zip(alone, datas, good, strict=True)
                   if d is not None and not ok}
            todo: list[tuple[int, Item]] = [
                (i, (k, d, BlockMeta(e.layout_id, e.checksum, e.size)))
                for i, d, ok in zip(alone, datas, good, strict=True) if ok and d is not None
                for k, e in (entries[i],)]
            for low, ok in zip(lows, oks, strict=True):
                batch = [it for i, it in todo if ok[i]]
                if not batch:
                    continue
                refused = self.copy_batch(low, batch)
                self._tally.demoted_many(pos, [k[0] for k, _, _ in batch if k not in refused])
                todo = [(i, it) for i, it in todo if it[0] in refused or not ok[i]]
                if not todo:
                    break
        if bad:  # never copied down: the block leaves the store
            self._checks.drop(pos, list(bad), "demote")
            entries = [(k, e) for k, e in entries if k not in bad]
            kept = [k for k, _ in entries]
        self._exits.remove(pos, kept)
        gone = [key for key, entry in entries if not entry.tiers]
        for key in gone:
            self._tally.evicted_from_store(key[0])
        self._exits.evicted(pos, gone)  # no copy left: the index entry and the pins go

    # -- shutdown ----------------------------------------------------------------------------
    def spill(self) -> tuple[int, int]:
        """Graceful shutdown: copy blocks only memory tiers hold into the first persistent tier
        (a batch per source tier; not asking admission: they earned their place), so that a
        restart finds them. Returns how many were written, and how many could not be (lost
        with the memory)."""
        target = self._stack.spill_target
        if target is None:
            return 0, 0
        lost = 0
        by_top: dict[int, list[tuple[BlockKey, Entry]]] = {}
        for key, entry in self._ledger.memory_items():
            if not entry.pending and entry.tiers and not entry.tiers >> target:
                by_top.setdefault(entry.top(), []).append((key, entry))
        for top, blocks in by_top.items():
            for i in range(0, len(blocks), MAX_DEMOTE_BATCH):
                chunk = blocks[i:i + MAX_DEMOTE_BATCH]
                datas = self._tiers[top].get_many([k for k, _ in chunk])
                good = self._checks.matches([e.checksum for _, e in chunk], datas)
                self._checks.drop(top, [k for (k, _), d, ok in zip(chunk, datas, good,
                                                                   strict=True)
                                        if d is not None and not ok], "demote")
                items: list[Item] = [(k, d, BlockMeta(e.layout_id, e.checksum, e.size))
                                     for (k, e), d, ok in zip(chunk, datas, good, strict=True)
                                     if ok and d is not None]
                lost += len(chunk) - len(items)
                lost += len(self.copy_batch(target, items, settle=False))
        try:
            self._tiers[target].flush()
        except Exception:  # the tier's close syncs again; the count above stays honest
            log.exception("syncing the spill to the %s tier failed", self._tiers[target].name)
        return sum(len(blocks) for blocks in by_top.values()) - lost, lost
