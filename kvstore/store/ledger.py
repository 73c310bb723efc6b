"""The store's ledger: which blocks exist, which tiers hold a copy of each, how every tier's
policy orders them, and how much each namespace holds.

Every change to those records goes through one method here (a new block, a new copy, a copy
gone, a block gone), so the index, the policies and the usage counts cannot drift apart
(``key in policies[t]`` exactly when ``index[key].tiers`` has bit ``t``: kept in
``add_copies`` and ``drop_copies`` alone). It never touches bytes; not thread-safe: called
under the lock.

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
from kvstore.store.placement import PlacementSink
from kvstore.store.prefix import stored_prefix
from kvstore.store.sizing import Sizing
from kvstore.types import BlockKey

KEPT, GONE, BACK = 0, 1, 2  # a watched block's fate (see Ledger.watch)


class Ledger:
    """Index (in RAM and cold), per-tier policies and per-namespace usage."""

    def __init__(self, policies: list[Policy], top_name_by_mask: list[str | None],
                 cold: ColdIndex | None = None, sizing: Sizing | None = None) -> None:
        self.policies = policies
        self._sizing = sizing  # told of every new copy, as the policies are
        self._index = BlockIndex()
        self._cold = cold if cold is not None else ColdIndex([], lambda _: None)
        self._usage: dict[str, NamespaceUsage] = {}
        self._top_name_by_mask = top_name_by_mask
        self._tier_bytes = [0] * len(policies)  # payload bytes of the copies each tier holds
        self._watched: dict[BlockKey, int] = {}  # see watch()
        self.sink: PlacementSink | None = None  # told of every change in where blocks lie
        for pos, tier in self._cold.catalogs:
            self._tier_bytes[pos] = tier.used_bytes()
            for ns, (blocks, nbytes) in tier.namespace_usage().items():
                usage = self.usage(ns)
                usage.blocks, usage.bytes = usage.blocks + blocks, usage.bytes + nbytes

    # -- reading -----------------------------------------------------------------------------
    def get(self, key: BlockKey) -> Entry | None:
        entry = self._index.get(key)
        if entry is None and self._cold.mask:
            return self._cold.load(key)
        return entry

    def get_many(self, keys: Sequence[BlockKey]) -> list[Entry | None]:
        """:meth:`get` of each key; the cold index is asked once for all the keys not in RAM
        (one read transaction, not one per block)."""
        if len(keys) == 1:  # a single-block read: no batch to build
            return [self.get(keys[0])]
        out = self._index.get_many(keys)
        todo = [i for i, entry in enumerate(out) if entry is None]
        if todo and self._cold.mask:
            for i, entry in zip(todo, self._cold.load_many([keys[i] for i in todo]), strict=True):
                out[i] = entry
        return out

    def holding(self, pos: int, keys: Sequence[BlockKey]) -> list[tuple[BlockKey, Entry]]:
        """The blocks of ``keys`` that tier ``pos`` holds a copy of, with their entries. A
        tier the cold index does not cover holds only blocks the RAM index has: the cold
        tiers are not read for it."""
        bit = 1 << pos
        entries = self.get_many(keys) if self._cold.mask & bit else self._index.get_many(keys)
        return [(k, e) for k, e in zip(keys, entries, strict=True)
                if e is not None and e.tiers & bit]

    def __contains__(self, key: object) -> bool:
        if key in self._index:
            return True
        return bool(self._cold.mask) and isinstance(key, tuple) and self._cold.has(key)

    def unknown(self, keys: Sequence[BlockKey]) -> list[BlockKey]:
        """The keys not ``in`` the ledger, in order (one read of the cold tiers for them all)."""
        missing = [k for k in keys if k not in self._index]
        if not missing or not self._cold.mask:
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
        """The top tier's name of each block of the longest stored prefix of ``hashes``
        (:func:`~kvstore.store.prefix.stored_prefix`)."""
        return stored_prefix(self._index, self._cold, self._top_name_by_mask, namespace, hashes)

    def keys_of(self, namespace: str) -> list[BlockKey]:
        """Every indexed key of ``namespace``, pending ones too."""
        keys = dict.fromkeys((namespace, h) for h in self._index.namespace(namespace))
        if self._cold.mask:
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
        self.add_blocks(pos, [(key, entry)])

    def add_blocks(self, pos: int, blocks: Sequence[tuple[BlockKey, Entry]]) -> None:
        """New published blocks whose first copy is in tier ``pos``."""
        for key, _ in blocks if self._watched else ():
            if self._watched.get(key) == GONE:
                self._watched[key] = BACK
        self._count_many(blocks, +1)
        self.add_copies(pos, blocks)

    def reserve(self, key: BlockKey, entry: Entry) -> None:
        """A pending block (a shared-memory write in flight): indexed, invisible, uncounted."""
        if self._watched.get(key) == GONE:
            self._watched[key] = BACK
        entry.pending = True
        self._index[key] = entry

    def publish_many(self, keys: Sequence[BlockKey], pos: int) -> list[Entry]:
        """Pending blocks were written into tier ``pos``: make them blocks like any other, as
        one batch (told to the policy in order)."""
        blocks = [(key, self._index[key]) for key in keys]
        for _, entry in blocks:
            entry.pending = False
        self._count_many(blocks, +1)
        self.add_copies(pos, blocks)
        return [entry for _, entry in blocks]

    def unreserve(self, key: BlockKey) -> bool:
        """Forget a pending block; False if ``key`` is not pending."""
        entry = self._index.get(key)
        if entry is None or not entry.pending:
            return False
        del self._index[key]
        return True

    def add_copy(self, pos: int, key: BlockKey, entry: Entry) -> None:
        """Tier ``pos`` now holds a copy of the block."""
        self.add_copies(pos, [(key, entry)])

    def add_copies(self, pos: int, blocks: Sequence[tuple[BlockKey, Entry]]) -> None:
        """Tier ``pos`` now holds a copy of each block (told to its policy in order)."""
        bit, added = 1 << pos, 0
        for _, entry in blocks:
            if not entry.tiers & bit:
                added += entry.size
                entry.tiers |= bit
        self._tier_bytes[pos] += added
        keys = [k for k, _ in blocks]
        self.policies[pos].on_put_many(keys, [e.size for _, e in blocks])
        if self._sizing is not None:
            self._sizing.entered(pos, keys)
        self._file(blocks)
        if self.sink is not None:
            self.sink.placed([(k, e.tiers) for k, e in blocks])

    def drop_copy(self, pos: int, key: BlockKey, entry: Entry) -> None:
        """Tier ``pos`` no longer holds a copy of the block."""
        self.drop_copies(pos, [(key, entry)])

    def drop_copies(self, pos: int, blocks: Sequence[tuple[BlockKey, Entry]]) -> None:
        """Tier ``pos`` no longer holds a copy of each block."""
        self.policies[pos].on_remove_many([k for k, _ in blocks])
        bit, dropped = 1 << pos, 0
        for _, entry in blocks:
            if entry.tiers & bit:
                dropped += entry.size
                entry.tiers &= ~bit
        self._tier_bytes[pos] -= dropped
        self._file(blocks)
        if self.sink is not None:
            self.sink.placed([(k, e.tiers) for k, e in blocks])

    def _file(self, blocks: Sequence[tuple[BlockKey, Entry]]) -> None:
        """Keep each entry in RAM while a memory tier holds the block (or it is pending or has
        no copy left, until :meth:`forget`), else in the cold index only."""
        mask = self._cold.mask
        cold = [not e.pending and e.tiers and not e.tiers & ~mask for _, e in blocks]
        self._index.set_many([b for b, c in zip(blocks, cold, strict=True) if not c])
        if any(cold):
            held = [b for b, c in zip(blocks, cold, strict=True) if c]
            self._index.pop_many([k for k, _ in held])
            self._cold.hold_many(held)

    def hits(self, pos: int, keys: Sequence[BlockKey]) -> None:
        """Tier ``pos`` served each of ``keys`` (told to its policy in order)."""
        self.policies[pos].on_hit_many(keys)

    def adopt(self, pos: int, key: BlockKey) -> bool:
        """Count a block cold tier ``pos`` (S3) took on its own (discovery); False if gone."""
        entry = self._index.get(key) or self._cold.held(key)  # the store's own view, if any
        if entry is None:
            entry = self._cold.load(key)  # built from the tiers: none counted it yet
            if entry is None or not entry.holds(pos):
                return False
            if entry.tiers == 1 << pos:
                self._count_many([(key, entry)], +1)
            self._tier_bytes[pos] += entry.size
            self.policies[pos].on_put(key, entry.size)
            if self._sizing is not None:
                self._sizing.entered(pos, [key])
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

    def forget(self, key: BlockKey, entry: Entry) -> None:
        """Remove a block whose copies are all gone from the index."""
        if key in self._watched:
            self._watched[key] = GONE
        held = self._index.pop(key, None) is not None
        if self._cold.mask:
            self._cold.release(key)
        if held and not entry.pending:
            self._count_many([(key, entry)], -1)
        if self.sink is not None and not entry.pending:
            self.sink.placed([(key, 0)])

    def forget_usage(self, namespace: str) -> None:
        """Drop the usage row of a deleted namespace (its blocks are gone)."""
        self._usage.pop(namespace, None)

    def _count_many(self, blocks: Sequence[tuple[BlockKey, Entry]], sign: int) -> None:
        """Count blocks in (``sign`` +1) or out (-1) of their namespaces' usage."""
        for (ns, _), entry in blocks:
            usage = self._usage.get(ns) or self.usage(ns)
            usage.blocks += sign
            usage.bytes += sign * entry.size
