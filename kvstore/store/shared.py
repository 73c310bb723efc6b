"""What a shared tier that indexes itself (S3) changed on its own, taken into the store's
records: blocks its discovery adopted are counted (usage, the tier's bytes, its policy), and
blocks it lost (a group object found gone or replaced, an upload dropped after its retries) are
uncounted, and dropped from the store when no other tier holds them.

The tier notes those changes as it makes them (:meth:`~kvstore.tiers.s3.S3Tier.changes`); the
store takes them under its lock after a discovery and a read of the tier, before it evicts
from the tier (so that an adopted block is counted before it can be named a victim), and
before ``stats`` and ``check_integrity``.
"""

from __future__ import annotations

from kvstore.store.counters import Tally
from kvstore.store.exits import Exits
from kvstore.store.ledger import Ledger
from kvstore.store.stack import TierStack
from kvstore.tiers.base import IndexedTier


class SharedChanges:
    """Takes the changes of the stack's shared tiers that index themselves (``positions``).
    Every method expects the store lock to be held."""

    def __init__(self, stack: TierStack, ledger: Ledger, exits: Exits, tally: Tally) -> None:
        # the shared tiers that index themselves: the others' changes are found by a read
        self._shared = {p: t for p, t in stack.shared if isinstance(t, IndexedTier)}
        self._ledger = ledger
        self._exits = exits
        self._tally = tally
        self.positions = frozenset(self._shared)

    def take(self, pos: int) -> bool:
        """Take tier ``pos``'s changes (nothing if it notes none); True if it adopted a block."""
        if pos not in self.positions:
            return False
        adopted = False
        for key, meta, new in self._shared[pos].changes():
            if new:
                adopted = self._ledger.adopt(pos, key) or adopted
                continue
            entry = self._ledger.lost(pos, key, meta.size)
            if entry is not None:
                self._exits.drop(key, entry, left=pos, why="lost")
                self._tally.lost(key[0])
        return adopted

    def take_all(self) -> None:
        for pos in self.positions:
            self.take(pos)
