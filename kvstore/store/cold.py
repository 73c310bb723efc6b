"""The cold index: blocks that only tiers indexing themselves hold (the disk tier's LMDB file,
the S3 tier's catalog), known without an entry in RAM.

A block whose copies are all in such tiers has no :class:`~kvstore.store.index.Entry` kept for
it: the tier answers whether it holds the block and with which meta (its header), and the
entry is built when the store asks (:meth:`ColdIndex.load`). Built entries are remembered
weakly, so that while any caller holds one, every ``load`` of that key returns the same object
and a change made through it (a copy added or dropped) is the one every caller sees; once
nobody holds it, it is gone and RAM holds nothing for the block. This is what lets a disk tier
of tens of millions of blocks cost no RAM per block and open without reading them, and what
a node holds in S3 likewise.

The ledger owns this index and is its only caller.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence

from kvstore.store.index import Entry
from kvstore.tiers.base import BlockMeta, IndexedTier
from kvstore.types import BlockKey


class ColdIndex:
    """Entries of the blocks that tiers ``catalogs`` (position, tier) hold, built on demand.
    ``layout_of(namespace)`` is the registered layout id (None if unregistered): a block stored
    under another layout is not the namespace's and reads as absent."""

    def __init__(self, catalogs: Sequence[tuple[int, IndexedTier]],
                 layout_of: Callable[[str], int | None]) -> None:
        self._catalogs = list(catalogs)
        self._layout_of = layout_of
        self.mask = sum(1 << pos for pos, _ in self._catalogs)  # a bit per cold tier; 0: none
        self._live: weakref.WeakValueDictionary[BlockKey, Entry] = weakref.WeakValueDictionary()

    @property
    def catalogs(self) -> list[tuple[int, IndexedTier]]:
        return self._catalogs

    def load(self, key: BlockKey) -> Entry | None:
        """The entry of a block the cold tiers hold (the same object while one is held)."""
        entry = self._live.get(key)
        if entry is not None:
            return entry
        found: BlockMeta | None = None
        tiers = 0
        for pos, tier in self._catalogs:
            meta = tier.metas([key])[0]
            if meta is not None:
                found = found or meta
                tiers |= 1 << pos
        return self._make(key, found, tiers, self._layout_of(key[0]))

    def load_many(self, keys: Sequence[BlockKey]) -> list[Entry | None]:
        """:meth:`load` of each key, with one ``metas`` call (one read transaction) per cold
        tier for all the keys no held entry answers, instead of one per key."""
        live = self._live
        out = [live.get(key) for key in keys]
        todo = [i for i, entry in enumerate(out) if entry is None]
        if not todo or not self._catalogs:
            return out
        asked = [keys[i] for i in todo]
        found: list[BlockMeta | None] = [None] * len(asked)
        tiers = [0] * len(asked)
        for pos, tier in self._catalogs:
            for j, meta in enumerate(tier.metas(asked)):
                if meta is not None:
                    found[j] = found[j] or meta
                    tiers[j] |= 1 << pos
        made: dict[BlockKey, Entry | None] = {}  # a key given twice gets one entry
        layouts = {ns: self._layout_of(ns) for ns in {key[0] for key in asked}}
        for i, key, meta, mask in zip(todo, asked, found, tiers, strict=True):
            if meta is None:
                continue
            if key not in made:
                made[key] = self._make(key, meta, mask, layouts[key[0]])
            out[i] = made[key]
        return out

    def _make(self, key: BlockKey, meta: BlockMeta | None, tiers: int,
              layout: int | None) -> Entry | None:
        """The entry of a block the cold tiers ``tiers`` hold with ``meta`` (None: none
        does), held from now on; ``layout`` is its namespace's registered layout id."""
        if meta is None:
            return None
        if layout is not None and meta.layout_id != layout:
            return None  # stored under another definition of the namespace
        entry = Entry(meta.size, meta.checksum, meta.layout_id, tiers)
        self._live[key] = entry
        return entry

    def hold(self, key: BlockKey, entry: Entry) -> None:
        """``entry`` (a block now only in cold tiers) is what :meth:`load` returns while held."""
        self._live[key] = entry

    def hold_many(self, blocks: Sequence[tuple[BlockKey, Entry]]) -> None:
        """:meth:`hold` of each ``(key, entry)``."""
        self._live.update(blocks)

    def held(self, key: BlockKey) -> Entry | None:
        """The entry of ``key`` a caller holds now, if any (the store's own view of it:
        ``load`` would build a fresh one from the tiers)."""
        return self._live.get(key)

    def release(self, key: BlockKey) -> None:
        self._live.pop(key, None)

    def has(self, key: BlockKey) -> bool:
        return self.load(key) is not None

    def leading(self, namespace: str, hashes: Sequence[bytes]) -> tuple[int, int]:
        """The stored run of a chain in the cold tiers, from its first hash: (length, the
        position of the tier holding it), from the first tier (top down) whose run is not
        empty. The caller asks again where the run ends, so a chain whose runs alternate
        between disk and S3 is found whole; a block of an S3 run that the disk holds too is
        named after S3."""
        for pos, tier in self._catalogs:
            run = tier.leading(namespace, hashes)
            if run:
                return run, pos
        return 0, -1

    def keys_of(self, namespace: str) -> list[BlockKey]:
        keys: dict[BlockKey, None] = {}
        for _, tier in self._catalogs:
            keys.update(dict.fromkeys(tier.keys_of(namespace)))
        return list(keys)

    def namespaces(self) -> set[str]:
        return {ns for _, tier in self._catalogs for ns in tier.namespace_usage()}

    def items(self, skip: Callable[[BlockKey], bool]) -> Iterator[tuple[BlockKey, Entry]]:
        """Every cold block's entry, except keys ``skip`` names (those the ledger keeps in RAM).
        Reads every key of the cold tiers: for checks, never on a request path."""
        for ns in sorted(self.namespaces()):
            for key in self.keys_of(ns):
                if skip(key):
                    continue
                entry = self.load(key)
                if entry is not None:
                    yield key, entry
