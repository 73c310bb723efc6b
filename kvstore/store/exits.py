"""The way out of the store: deleting a block's copies tier by tier, forgetting a block
(its index entry, its pins) and recording the ghost of its departure.

Every block that leaves the store leaves through :class:`Exits`: an eviction with no lower
tier to keep it (:class:`~kvstore.store.placer.Placer`), a corrupt or lost copy
(:class:`~kvstore.store.reader.Reader`), a delete or a namespace going away
(:class:`~kvstore.store.host_path.HostPath`). Every method expects the store lock to be held.
"""

from __future__ import annotations

from kvstore.store.ghosts import Ghosts
from kvstore.store.index import Entry
from kvstore.store.leases import LeaseTable
from kvstore.store.ledger import Ledger
from kvstore.store.stack import TierStack
from kvstore.types import BlockKey, LeftBecause


class Exits:
    """Takes blocks out of tiers and out of the store. Owns no records: it changes the ledger,
    the leases and the ghosts through their own methods. :meth:`drop` and :meth:`evicted`
    record the ghost; a delete calls :meth:`remember` before :meth:`drop_many`."""

    def __init__(self, stack: TierStack, ledger: Ledger, leases: LeaseTable,
                 ghosts: Ghosts) -> None:
        self._stack = stack
        self._tiers = stack.tiers
        self._ledger = ledger
        self._leases = leases
        self._ghosts = ghosts

    def remove(self, pos: int, keys: list[BlockKey]) -> None:
        """Delete the copies tier ``pos`` holds of ``keys`` (one tier call)."""
        held = self._ledger.holding(pos, keys)
        if not held:
            return
        self._tiers[pos].delete([k for k, _ in held])
        self._ledger.drop_copies(pos, held)

    def drop(self, key: BlockKey, entry: Entry, *, left: int, why: LeftBecause) -> None:
        """Forget a block that leaves the store from tier ``left`` because ``why``: delete
        every copy left, its index entry and its pins, and record its ghost."""
        self.forget(key, entry)
        self._ghosts.record((key,), self._stack.names[left], why)

    def evicted(self, pos: int, gone: list[BlockKey]) -> None:
        """Forget blocks evicted from tier ``pos`` that no tier holds any more (only their
        index entries and pins are left), and record their ghosts."""
        for key, entry in zip(gone, self._ledger.get_many(gone), strict=True):
            self.forget(key, entry)
        if gone:
            self._ghosts.record(gone, self._stack.names[pos], "evicted")

    def forget(self, key: BlockKey, entry: Entry | None) -> None:
        """Delete every copy of a block, its index entry and its pins; records no ghost."""
        if entry is None:
            return
        for pos in entry.positions():
            self.remove(pos, [key])
        self._ledger.forget(key, entry)
        self._leases.forget(key)

    def remember(self, keys: list[BlockKey], why: LeftBecause) -> None:
        """Record the ghosts of blocks about to leave the store through :meth:`drop_many`,
        each naming the top tier it is in now."""
        by_top: dict[int, list[BlockKey]] = {}
        for key, entry in zip(keys, self._ledger.get_many(keys), strict=True):
            if entry is not None and entry.tiers:
                by_top.setdefault(entry.top(), []).append(key)
        for pos, gone in by_top.items():
            self._ghosts.record(gone, self._stack.names[pos], why)

    def drop_many(self, keys: list[BlockKey]) -> None:
        """Forget blocks: delete their copies with one call per tier, then their index entries
        and pins (a namespace's deletion: one LMDB transaction, not one per block). Records no
        ghost: a delete calls :meth:`remember` first, a namespace going away does not."""
        for pos in range(len(self._tiers)):
            self.remove(pos, keys)
        for key, entry in zip(keys, self._ledger.get_many(keys), strict=True):
            if entry is not None:
                self._ledger.forget(key, entry)
            self._leases.forget(key)
