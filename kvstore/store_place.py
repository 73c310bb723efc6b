"""Placement and eviction: where a new block goes, how tiers make room (demoting victims
down the stack), write-through copies and the spill to disk on close. Call with the store
lock held.

Checksums are computed here, lazily: a block that only memory tiers hold has none (they never
verify), and :meth:`Placement._write` computes it the first time the block goes to a tier that
keeps one (disk, S3), recording it in the index entry too."""

from __future__ import annotations

import logging

from kvstore.checksum import checksum
from kvstore.errors import CapacityError, TierUnavailableError
from kvstore.index import Entry
from kvstore.stats import NamespaceUsage
from kvstore.store_core import StoreCore
from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.store")


class Placement(StoreCore):
    """Mixin of :class:`kvstore.store.Store`."""

    def _place_batch(
        self, items: list[tuple[BlockKey, Buffer, BlockMeta]], pos: int
    ) -> list[tuple[BlockKey, Buffer, BlockMeta]]:
        """Store a whole batch in tier ``pos`` with one ``put_many`` (the common case: the
        top tier makes room by demoting). Returns the items it did not store: all of them if
        the batch does not fit as a whole."""
        if not items or not self._write(pos, items):
            return items
        bit = 1 << pos
        for key, _, meta in items:
            self._index[key] = Entry(meta.size, meta.checksum, meta.layout_id, tiers=bit)
            self._track(pos, key, meta.size)
            usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
            usage.blocks += 1
            usage.bytes += meta.size
        for low in range(pos + 1, len(self._tiers)):
            if not self._tcfg[low].write_through:
                continue
            down = [it for it in items if self._admissions[low].admit(it[0])]
            if down and self._write(low, down):
                for key, _, meta in down:
                    entry = self._index.get(key)
                    if entry is not None:
                        entry.tiers |= 1 << low
                        self._track(low, key, meta.size)
                    else:  # cannot happen today (a batch key always keeps its pos copy)
                        self._tiers[low].delete([key])
                self._settle(low)
        self._settle(pos)
        return []

    def _place(self, item: tuple[BlockKey, Buffer, BlockMeta], start: int) -> bool:
        """Store a new block in the first tier at or below ``start`` that admits it and can make
        room; also into write-through tiers below. False if no tier could take it."""
        key = item[0]
        for pos in range(start, len(self._tiers)):
            if pos > start and not self._admissions[pos].admit(key):
                continue
            one = [item]
            if self._write(pos, one):
                _, data, meta = item = one[0]  # _write may have added the checksum
                entry = Entry(meta.size, meta.checksum, meta.layout_id, tiers=1 << pos)
                self._index[key] = entry
                self._track(pos, key, meta.size)
                usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
                usage.blocks += 1
                usage.bytes += meta.size
                self._write_through(pos, key, data, meta, entry)
                self._settle(pos)
                return True
        return False

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
        if self._write(pos, [(key, data, BlockMeta(entry.layout_id, entry.checksum, entry.size))]):
            entry.tiers |= 1 << pos
            self._track(pos, key, entry.size)
            self._settle(pos)

    def _write_through(
        self, pos: int, key: BlockKey, data: Buffer, meta: BlockMeta, entry: Entry
    ) -> None:
        for low in range(pos + 1, len(self._tiers)):
            if self._tcfg[low].write_through and self._admissions[low].admit(key) \
                    and self._write(low, [(key, data, meta)]):
                entry.tiers |= 1 << low
                self._track(low, key, meta.size)
                self._settle(low)

    def _write(self, pos: int, items: list[tuple[BlockKey, Buffer, BlockMeta]]) -> bool:
        """Make room in tier ``pos`` and write ``items``; False if it cannot. For a tier that
        keeps checksums, items without one get it computed, in ``items`` (callers read their
        metas back) and in the index entry if the block has one."""
        tier = self._tiers[pos]
        need = sum(tier.charge(m.size) for _, _, m in items)
        if need > tier.capacity_bytes or not self._make_room(pos, need):
            return False
        if tier.needs_checksum:
            self._seal(items)
        try:
            tier.put_many(items)
        except (CapacityError, TierUnavailableError) as exc:
            log.warning("%s tier refused %d blocks: %s", tier.name, len(items), exc)
            return False
        return True

    def _seal(self, items: list[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        """Fill in missing checksums, in place."""
        for i, (key, data, meta) in enumerate(items):
            if meta.checksum is None:
                csum = checksum(data)
                items[i] = (key, data, meta._replace(checksum=csum))
                entry = self._index.get(key)
                if entry is not None and entry.checksum is None:
                    entry.checksum = csum

    def _make_room(self, pos: int, need: int) -> bool:
        """Evict from tier ``pos`` until ``need`` more bytes fit under its capacity."""
        tier = self._tiers[pos]
        while tier.used_bytes() + need > tier.capacity_bytes:
            if not self._evict(pos, tier.used_bytes() + need - tier.capacity_bytes):
                return False
        return True

    def _settle(self, pos: int) -> None:
        """Past the high watermark, evict down to the low watermark."""
        tier, cfg = self._tiers[pos], self._tcfg[pos]
        if tier.used_bytes() > cfg.high_watermark * tier.capacity_bytes:
            self._evict(pos, tier.used_bytes() - int(cfg.low_watermark * tier.capacity_bytes))

    def _evict(self, pos: int, nbytes: int) -> bool:
        """Move victims out of tier ``pos`` until ``nbytes`` are freed. False if none could be
        evicted (everything resident is pinned or being read)."""
        tier, policy = self._tiers[pos], self._policies[pos]
        freed = 0
        while freed < nbytes:
            victims = policy.victims(8, self._evictable)
            if not victims:
                return freed > 0
            for key in victims:
                entry = self._index[key]
                before = tier.used_bytes()
                self._demote(pos, key, entry)
                freed += before - tier.used_bytes()
                if freed >= nbytes:
                    break
        return True

    def _demote(self, pos: int, key: BlockKey, entry: Entry) -> None:
        """Take ``key`` out of tier ``pos``: keep it in a lower tier (copying it down if no
        lower tier holds it yet and one admits it), else drop it from the store."""
        stats = self._tier_stats[pos]
        stats.evictions += 1
        lower = entry.tiers >> (pos + 1)
        if not lower:
            for low in range(pos + 1, len(self._tiers)):
                if not self._admissions[low].admit(key):
                    continue
                data = self._tiers[pos].get_many([key])[0]
                if data is None:
                    break
                meta = BlockMeta(entry.layout_id, entry.checksum, entry.size)
                if self._write(low, [(key, data, meta)]):
                    entry.tiers |= 1 << low
                    self._track(low, key, entry.size)
                    stats.demotions += 1
                    self._ns_counters(key[0]).demotions += 1
                    self._totals.demotions += 1
                    self._settle(low)
                    break
        self._remove_from(pos, key, entry)
        if not entry.tiers:
            self._drop_entry(key, entry)
            self._ns_counters(key[0]).evictions += 1
            self._ns_counters(key[0]).dropped += 1
            self._totals.evictions += 1
            self._totals.dropped += 1

    def _evictable(self, key: BlockKey) -> bool:
        entry = self._index.get(key)
        if entry is None or entry.readers:
            return False
        return not self._leases.is_pinned(key)


    def _spill(self) -> None:
        """Graceful shutdown: copy blocks that only memory tiers hold into the first persistent
        tier, so that a restart finds them. Admission is not asked: these blocks earned their
        place in memory already."""
        target = next(
            (p for p, t in enumerate(self._tiers)
             if t.persistent and getattr(t, "discover", None) is None),
            None,
        )
        if target is None:
            return
        for key, entry in list(self._index.items()):
            if entry.pending or entry.tiers >> target or not entry.tiers:
                continue
            data = self._tiers[entry.top()].get_many([key])[0]
            if data is None:
                continue
            meta = BlockMeta(entry.layout_id, entry.checksum, entry.size)
            if self._write(target, [(key, data, meta)]):
                entry.tiers |= 1 << target
                self._track(target, key, entry.size)
        self._tiers[target].flush()

