"""Which keys a tier's eviction policy may name as victims.

A policy asks this predicate of each key it would name. It lives apart from the ledger so
that a policy never calls back into the ledger that drives it: the ledger hands a
:class:`Candidates` to the policy, which asks it about keys, and it reads only the index, the
cold index and the lease table below them.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstore.store.cold import ColdIndex
from kvstore.store.index import BlockIndex
from kvstore.types import BlockKey


class Candidates:
    """True for a key the ledger records in tier ``pos`` and ``evictable`` lets go. A tier
    that indexes itself samples its own file, which also holds a batch the background demoter
    wrote and has not recorded yet (it waits for the store lock): evicting those would free
    nothing, so they are not candidates."""

    __slots__ = ("_cold", "_evictable", "_index", "_pos")

    def __init__(self, index: BlockIndex, cold: ColdIndex, pos: int,
                 evictable: Callable[[BlockKey], bool]) -> None:
        self._index = index
        self._cold = cold
        self._pos = pos
        self._evictable = evictable

    def __call__(self, key: BlockKey) -> bool:
        entry = self._index.get(key)
        if entry is None and self._cold.mask:
            entry = self._cold.load(key)
        # Entry.holds inlined: a policy asks this of every key it considers
        return entry is not None and bool(entry.tiers >> self._pos & 1) and self._evictable(key)
