"""Reads: serve blocks from their top tier, verify checksums, promote hits, count stats,
prefetch, and discover blocks that shared tiers (S3) hold."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kvstore.checksum import checksum
from kvstore.index import Entry
from kvstore.stats import NamespaceUsage
from kvstore.store_core import fmt_key
from kvstore.store_place import Placement
from kvstore.tiers.base import BlockMeta
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.store")


class Reads(Placement):
    """Mixin of :class:`kvstore.store.Store` (promotion places blocks, hence the base)."""

    def _read(
        self, keys: list[BlockKey], *, promote: bool, count: bool, promote_to: int = 0
    ) -> list[bytes | None]:
        """Read blocks from their top tier, verify, promote (copy up into tier
        ``promote_to``). Persistent tiers are read outside the lock, one batched call per
        tier."""
        out: list[bytes | None] = [None] * len(keys)
        served_by: list[int] = [-1] * len(keys)
        missing = [i for i, k in enumerate(keys) if k not in self._index]
        if missing:
            self._discover([keys[i] for i in missing])
        with self._lock:
            self._check_open()
            slow: dict[int, list[int]] = {}
            reading: list[Entry] = []
            for i, key in enumerate(keys):
                entry = self._index.get(key)
                if entry is None or entry.pending or not entry.tiers:
                    continue
                pos = entry.top()
                if self._tiers[pos].persistent:
                    entry.readers += 1
                    reading.append(entry)
                    slow.setdefault(pos, []).append(i)
                else:
                    out[i] = self._tiers[pos].get_many([key])[0]
                    served_by[i] = pos if out[i] is not None else -1
        for pos, idxs in slow.items():
            try:
                datas = self._tiers[pos].get_many([keys[i] for i in idxs])
            except Exception as exc:  # a failing back end is a miss, never an error to callers
                log.warning("%s tier read failed: %s", self._names[pos], exc)
                datas = [None] * len(idxs)
            for i, data in zip(idxs, datas, strict=True):
                out[i] = data
                served_by[i] = pos
        with self._lock:
            for entry in reading:
                entry.readers -= 1
            entries: list[Entry | None] = [None] * len(keys)
            for i, key in enumerate(keys):
                pos = served_by[i]
                if pos < 0:
                    continue
                entry = entries[i] = self._index.get(key)
                data = out[i]
                if data is None and entry is not None and entry.holds(pos) \
                        and not self._tiers[pos].contains(key):
                    # the tier lost it behind our back (an S3 upload dropped after retries,
                    # an object deleted by another node): forget that copy
                    self._remove_from(pos, key, entry)
                    if not entry.tiers:
                        self._drop_entry(key, entry)
                        self._ns_counters(key[0]).dropped += 1
                        self._totals.dropped += 1
                # a persistent-tier read ran unlocked: the block may have left meanwhile
                # (memory-tier reads ran under the lock and are valid as read)
                left = self._tiers[pos].persistent and (entry is None or not entry.holds(pos))
                if entry is None or data is None or left:
                    out[i], served_by[i] = None, -1
                    continue
                if self._tiers[pos].verify_reads and checksum(data) != entry.checksum:
                    self._corrupt(pos, key, entry)
                    out[i], served_by[i] = None, -1
            # promotions come last: they may evict blocks this same call just read
            for i, key in enumerate(keys):
                pos, entry, data = served_by[i], entries[i], out[i]
                if pos < 0 or entry is None or data is None:
                    continue
                self._policies[pos].on_hit(key)
                if count:
                    for adm in self._admissions:
                        adm.on_access(key)
                if promote and pos > promote_to:
                    self._promote(key, entry, data, promote_to)
            if count:
                self._count_reads(keys, served_by, out)
        return out

    def _promote(self, key: BlockKey, entry: Entry, data: bytes, to: int = 0) -> None:
        """Copy a block read from a lower tier into tier ``to`` (the lower copy stays)."""
        # an earlier promotion in the same batch may have cascaded into evicting this block
        if entry.holds(to) or self._index.get(key) is not entry:
            return
        meta = BlockMeta(entry.layout_id, entry.checksum, entry.size)
        if self._write(to, [(key, data, meta)]):
            entry.tiers |= 1 << to
            self._track(to, key, entry.size)
            self._tier_stats[to].promotions += 1
            self._ns_counters(key[0]).promotions += 1
            self._totals.promotions += 1
            self._settle(to)

    def _corrupt(self, pos: int, key: BlockKey, entry: Entry) -> None:
        log.error(
            "checksum mismatch for %s in the %s tier: dropped", fmt_key(key), self._names[pos]
        )
        self._remove_from(pos, key, entry)
        if not entry.tiers:
            self._drop_entry(key, entry)
        self._tier_stats[pos].corrupt_dropped += 1
        self._ns_counters(key[0]).corrupt_dropped += 1
        self._totals.corrupt_dropped += 1

    def _count_reads(
        self, keys: list[BlockKey], served_by: list[int], out: list[bytes | None]
    ) -> None:
        for key, pos, data in zip(keys, served_by, out, strict=True):
            hit = data is not None
            ns = self._ns_counters(key[0])
            for c in (ns, self._totals):
                c.queries += 1
                c.hits += hit
                c.misses += not hit
            # each tier above the serving one was asked and missed
            last = pos if hit else len(self._tiers) - 1
            for p in range(last + 1):
                t = self._tier_stats[p]
                t.queries += 1
                served = hit and p == pos
                t.hits += served
                t.misses += not served

    def _prefetch(self, keys: list[BlockKey]) -> int:
        with self._lock:
            todo = [
                k for k in keys
                if (e := self._index.get(k)) is not None and e.tiers and not e.holds(0)
            ]
        if todo:
            datas = self._read(todo, promote=True, count=False)
            with self._lock:
                got = sum(d is not None for d in datas)
                self._tier_stats[0].prefetched += got
                self._totals.prefetched += got
        with self._lock:
            return sum(
                1 for k in keys if (e := self._index.get(k)) is not None and e.holds(0)
            )

    def _discover(self, keys: Sequence[BlockKey], *, prefix: bool = False) -> bool:
        """Ask shared tiers (those with ``discover``, i.e. S3) about keys missing from the
        index, and index what they hold. With ``prefix`` the keys are a hash chain and the
        tier may stop asking after the first miss. True if anything was found."""
        found = False
        for tier in self._shared:
            pos = self._tiers.index(tier)
            try:
                metas = tier.discover(list(keys), prefix=prefix)
            except Exception as exc:
                log.warning("%s discover failed: %s", tier.name, exc)
                continue
            with self._lock:
                for key, meta in zip(keys, metas, strict=True):
                    if meta is None or key in self._index or key[0] not in self._namespaces:
                        continue
                    if meta.layout_id != self._namespaces.get(key[0]).layout_id:
                        continue
                    self._index[key] = Entry(meta.size, meta.checksum, meta.layout_id, 1 << pos)
                    self._track(pos, key, meta.size)
                    usage = self._ns_usage.setdefault(key[0], NamespaceUsage())
                    usage.blocks += 1
                    usage.bytes += meta.size
                    found = True
        return found

