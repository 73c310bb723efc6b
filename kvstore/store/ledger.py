"""The store's ledger: which blocks exist, which tiers hold a copy of each, how every tier's
policy orders them, and how much each namespace holds.

Every change to those records goes through one method here (a new block, a new copy, a copy
gone, a block gone), so the index, the policies and the usage counts cannot drift apart
(``key in policies[t]`` exactly when ``index[key].tiers`` has bit ``t``: kept in ``add_copy``
and ``drop_copy`` alone). It never touches bytes; not thread-safe: called under the lock.

Two indexes, one view: blocks in a memory tier (or a shared-memory write pending) have an
entry in RAM (:class:`~kvstore.store.index.BlockIndex`); blocks only tiers that index
themselves hold (disk, S3) are in the cold index (:mod:`kvstore.store.cold`), which asks the
tier. :meth:`Ledger._file` moves an entry between them as its copies change (one with no copy
stays in RAM until :meth:`Ledger.forget`). At start usage and cold tiers' bytes come from the
tiers' counts (a block both disk and S3 hold counts in each); what S3 adopts or loses alone
comes in by :meth:`Ledger.adopt` and :meth:`Ledger.lost`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from kvstore.policy import Policy
from kvstore.store.candidates import Candidates
from kvstore.store.cold import ColdIndex
from kvstore.store.counters import NamespaceUsage
from kvstore.store.index import BlockIndex, Entry
from kvstore.types import BlockKey

KEPT, GONE, BACK = 0, 1, 2  # a watched block's fate (see Ledger.watch)


class Ledger:
    """Index (in RAM and cold), per-tier policies and per-namespace usage."""

    def __init__(self, policies: list[Policy], top_name_by_mask: list[str | None],
                 cold: ColdIndex | None = None) -> None:
        self.policies = policies
        self._index = BlockIndex()
        self._cold = cold if cold is not None else ColdIndex([], lambda _: None)
        self._usage: dict[str, NamespaceUsage] = {}
        self._top_name_by_mask = top_name_by_mask
        self._tier_bytes = [0] * len(policies)  # payload bytes of the copies each tier holds
        self._watched: dict[BlockKey, int] = {}  # see watch()
        for pos, tier in self._cold.catalogs:
            self._tier_bytes[pos] = tier.used_bytes()
            for ns, (blocks, nbytes) in tier.namespace_usage().items():
                usage = self.usage(ns)
                usage.blocks, usage.bytes = usage.blocks + blocks, usage.bytes + nbytes

    # -- reading -----------------------------------------------------------------------------
    def get(self, key: BlockKey) -> Entry | None:
        entry = self._index.get(key)
        if entry is None and self._cold:
            return self._cold.load(key)
        return entry

    def get_many(self, keys: Sequence[BlockKey]) -> list[Entry | None]:
        """:meth:`get` of each key; the cold index is asked once for all the keys not in RAM
        (one read transaction, not one per block)."""
        if len(keys) == 1:  # a single-block read: no batch to build
            return [self.get(keys[0])]
        get = self._index.get
        out = [get(key) for key in keys]
        todo = [i for i, entry in enumerate(out) if entry is None]
        if todo and self._cold:
            for i, entry in zip(todo, self._cold.load_many([keys[i] for i in todo]), strict=True):
                out[i] = entry
        return out

    def __contains__(self, key: object) -> bool:
        if key in self._index:
            return True
        return bool(self._cold) and isinstance(key, tuple) and self._cold.has(key)

    def unknown(self, keys: Sequence[BlockKey]) -> list[BlockKey]:
        """The keys of ``keys`` that are not ``in`` the ledger, in order: what ``in`` answers
        for each, with one read of the cold tiers for the whole batch."""
        missing = [k for k in keys if k not in self._index]
        if not missing or not self._cold:
            return missing
        return [k for k, e in zip(missing, self._cold.load_many(missing), strict=True)
                if e is None]

    def items(self) -> Iterator[tuple[BlockKey, Entry]]:
        """Every block, cold ones too (reads every key of the disk tier: checks only)."""
        yield from self._index.items()
        yield from self._cold.items(skip=self._index.__contains__)

    def memory_items(self) -> Iterator[tuple[BlockKey, Entry]]:
        """The blocks with an entry in RAM: every block a memory tier holds, and pending ones."""
        return self._index.items()

    def visible(self, key: BlockKey) -> Entry | None:
        """The entry of a published block that some tier holds, else None."""
        return self.visible_many([key])[0]

    def visible_many(self, keys: Sequence[BlockKey]) -> list[Entry | None]:
        """:meth:`visible` of each key, the cold ones loaded in one batch."""
        return [e if e is not None and not e.pending and e.tiers else None
                for e in self.get_many(keys)]

    def prefix(self, namespace: str, hashes: Sequence[bytes]) -> list[str]:
        """The top tier's name of each block of the longest stored prefix of ``hashes``: a
        ``dict.get`` per block in RAM, then a cold tier's stored run of the rest in one read.
        An unhashable "hash" ends the prefix (the caller validates the tail)."""
        by_mask = self._top_name_by_mask
        tiers: list[str] = []
        append = tiers.append
        get = self._index.namespace(namespace).get
        try:
            for h in hashes:
                entry = get(h)
                if entry is None:
                    break
                name = by_mask[entry.tiers]
                if name is None:  # pending shm write: not visible yet
                    return tiers
                append(name)
            else:
                return tiers
            if self._cold:
                self._cold_tail(namespace, hashes, tiers)
        except TypeError:
            pass
        return tiers

    def _cold_tail(self, namespace: str, hashes: Sequence[bytes], tiers: list[str]) -> None:
        """Extend ``tiers`` past its first block not in RAM: the disk tier's stored run of the
        chain, then RAM again, and so on."""
        by_mask = self._top_name_by_mask
        get = self._index.namespace(namespace).get
        i, n = len(tiers), len(hashes)
        while i < n:
            entry = get(hashes[i])
            if entry is None:
                run, pos = self._cold.leading(namespace, hashes[i:])
                if run == 0:
                    return
                cold_name = by_mask[1 << pos] or ""  # a one-tier mask always names it
                hots = list(map(get, hashes[i:i + run]))  # a memory tier may hold some too
                if any(hots):  # (an Entry is always true) their top tier is higher
                    tiers.extend(cold_name if hot is None else by_mask[hot.tiers] or cold_name
                                 for hot in hots)
                else:
                    tiers.extend([cold_name] * run)
                i += run
                continue
            name = by_mask[entry.tiers]
            if name is None:
                return
            tiers.append(name)
            i += 1

    def keys_of(self, namespace: str) -> list[BlockKey]:
        """Every indexed key of ``namespace``, pending ones too."""
        keys = dict.fromkeys((namespace, h) for h in self._index.namespace(namespace))
        if self._cold:
            keys.update(dict.fromkeys(self._cold.keys_of(namespace)))
        return list(keys)

    def usage(self, namespace: str) -> NamespaceUsage:
        return self._usage.setdefault(namespace, NamespaceUsage())

    def usages(self) -> dict[str, NamespaceUsage]:
        return self._usage

    def resident(self, pos: int) -> int:
        """How many blocks tier ``pos`` holds (its policy tracks exactly those)."""
        return len(self.policies[pos])

    def resident_bytes(self, pos: int) -> int:
        """The payload bytes of the blocks tier ``pos`` holds (logical bytes: without the
        rounding up to whole slots that the tier charges against its capacity)."""
        return self._tier_bytes[pos]

    def victims(self, pos: int, n: int, evictable: Callable[[BlockKey], bool]) -> list[BlockKey]:
        """Up to ``n`` keys to take out of tier ``pos``: the policy's, among the blocks this
        ledger records in that tier (see :class:`~kvstore.store.candidates.Candidates`)."""
        return self.policies[pos].victims(n, Candidates(self._index, self._cold, pos, evictable))

    # -- blocks a writer outside the lock is copying (the background demoter) ---------------
    def watch(self, keys: Iterable[BlockKey]) -> None:
        """Note from now on whether each of ``keys`` is forgotten (and put again after): a copy
        written below without the lock cannot tell otherwise (the disk answers for itself)."""
        self._watched.update(dict.fromkeys(keys, KEPT))

    def unwatch(self, keys: Iterable[BlockKey]) -> dict[BlockKey, int]:
        """Stop watching ``keys``: each one's fate (``KEPT``, ``GONE``, ``BACK``: put again)."""
        return {key: self._watched.pop(key, KEPT) for key in keys}

    # -- changing ----------------------------------------------------------------------------
    def add_block(self, key: BlockKey, entry: Entry, pos: int) -> None:
        """A new published block whose first copy is in tier ``pos``."""
        if self._watched.get(key) == GONE:
            self._watched[key] = BACK
        self._count(key[0], entry.size, +1)
        self.add_copy(pos, key, entry)

    def reserve(self, key: BlockKey, entry: Entry) -> None:
        """A pending block (a shared-memory write in flight): indexed, invisible, uncounted."""
        if self._watched.get(key) == GONE:
            self._watched[key] = BACK
        entry.pending = True
        self._index[key] = entry

    def publish(self, key: BlockKey, pos: int) -> Entry:
        """A pending block was written into tier ``pos``: make it a block like any other."""
        entry = self._index[key]
        entry.pending = False
        self._count(key[0], entry.size, +1)
        self.add_copy(pos, key, entry)
        return entry

    def unreserve(self, key: BlockKey) -> bool:
        """Forget a pending block; False if ``key`` is not pending."""
        entry = self._index.get(key)
        if entry is None or not entry.pending:
            return False
        del self._index[key]
        return True

    def add_copy(self, pos: int, key: BlockKey, entry: Entry) -> None:
        """Tier ``pos`` now holds a copy of the block."""
        if not entry.tiers & (1 << pos):
            self._tier_bytes[pos] += entry.size
        entry.tiers |= 1 << pos
        self.policies[pos].on_put(key, entry.size)
        self._file(key, entry)

    def drop_copy(self, pos: int, key: BlockKey, entry: Entry) -> None:
        """Tier ``pos`` no longer holds a copy of the block."""
        self.policies[pos].on_remove(key)
        if entry.tiers & (1 << pos):
            self._tier_bytes[pos] -= entry.size
        entry.tiers &= ~(1 << pos)
        self._file(key, entry)

    def _file(self, key: BlockKey, entry: Entry) -> None:
        """In RAM while a memory tier holds the block, it is pending or has no copy left (until
        :meth:`forget`), else in the cold index only."""
        if entry.pending or not entry.tiers or entry.tiers & ~self._cold.mask:
            self._index[key] = entry
        else:
            self._index.pop(key)
            self._cold.hold(key, entry)

    def adopt(self, pos: int, key: BlockKey) -> bool:
        """Count a block cold tier ``pos`` (S3) took on its own (discovery); False if gone."""
        entry = self._index.get(key) or self._cold.held(key)  # the store's own view, if any
        if entry is None:
            entry = self._cold.load(key)  # built from the tiers: none counted it yet
            if entry is None or not entry.holds(pos):
                return False
            if entry.tiers == 1 << pos:
                self._count(key[0], entry.size, +1)
            self._tier_bytes[pos] += entry.size
            self.policies[pos].on_put(key, entry.size)
            return True
        if entry.pending or entry.holds(pos):
            return False
        self.add_copy(pos, key, entry)
        return True

    def lost(self, pos: int, key: BlockKey, size: int) -> Entry | None:
        """Cold tier ``pos`` (S3) lost a block of ``size`` bytes on its own: uncount it. The
        entry of a block no tier holds now is returned for the caller to drop."""
        entry = self._index.get(key) or self._cold.held(key)  # the store's own view, if any
        if entry is not None:
            if not entry.holds(pos):
                return None
            self.drop_copy(pos, key, entry)
            return None if entry.tiers else entry
        self.policies[pos].on_remove(key)  # the tiers' view already lacks it
        self._tier_bytes[pos] -= size
        if self._cold.load(key) is not None:
            return None
        self._index[key] = Entry(size, None, 0)  # counted until forget
        return self._index[key]

    def hit(self, pos: int, key: BlockKey) -> None:
        self.policies[pos].on_hit(key)

    def forget(self, key: BlockKey, entry: Entry) -> None:
        """Remove a block whose copies are all gone from the index."""
        if key in self._watched:
            self._watched[key] = GONE
        held = self._index.pop(key, None) is not None
        if self._cold:
            self._cold.release(key)
        if held and not entry.pending:
            self._count(key[0], entry.size, -1)

    def forget_usage(self, namespace: str) -> None:
        """Drop the usage row of a deleted namespace (its blocks are gone)."""
        self._usage.pop(namespace, None)

    def _count(self, namespace: str, size: int, sign: int) -> None:
        usage = self.usage(namespace)
        usage.blocks += sign
        usage.bytes += sign * size
