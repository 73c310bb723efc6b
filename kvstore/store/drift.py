"""What tiers changed on their own, taken into the store's records: blocks a shared tier that
indexes itself (S3) adopted through discovery or lost (a group object found gone or replaced,
an upload dropped after its retries), and blocks a tier found damaged (the disk tier: keys on
damaged LMDB pages, values with a bad header).

S3 notes its changes as it makes them (:meth:`~kvstore.tiers.s3.S3Tier.changes`); they are
taken after a discovery and a read of the tier, before it evicts (so that an adopted block is
counted before it can be named a victim), and before ``stats`` and ``check_integrity``.
Damage is swept before a read's checks (a block on a damaged page is corrupt) and before
``stats``, and counted as corrupt with its cause, as a checksum that fails is
(:meth:`~kvstore.store.reader.Reader.read`).
"""

from __future__ import annotations

from kvstore.store.counters import Tally
from kvstore.store.exits import Exits
from kvstore.store.ledger import Ledger
from kvstore.store.stack import TierStack
from kvstore.tiers.base import FindsDamage, IndexedTier


class Drift:
    """Takes the shared tiers' own changes (``positions``: those that note them) and the
    damage tiers found. Every method expects the store lock to be held."""

    def __init__(self, stack: TierStack, ledger: Ledger, exits: Exits, tally: Tally) -> None:
        # the shared tiers that index themselves: the others' changes are found by a read
        self._shared = {p: t for p, t in stack.shared if isinstance(t, IndexedTier)}
        self._damaged = [(pos, tier) for pos, tier in enumerate(stack.tiers)
                         if isinstance(tier, FindsDamage)]
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

    def sweep(self) -> None:
        """Drop the copy of each block found damaged since the last sweep (the block leaves
        the store if that was its last copy) and count it corrupt, by cause. The tier has
        logged it (once)."""
        for pos, tier in self._damaged:
            if not tier.damage_pending:  # the common case, tested without a call
                continue
            for key, cause in tier.take_damaged():
                self._tally.corrupt(pos, key[0], cause)
                if cause != "disk_page":
                    # a bad header: the tier never counted it as a block it holds (it may be
                    # someone else's value); a copy the index holds goes at its read
                    continue
                # The tier counted the block out of its own counts; the store does the same
                # (the tier cannot say the size, but a namespace's blocks all have one).
                size = self._tally.block_bytes.get(key[0], 0)
                entry = self._ledger.lost(pos, key, size)
                if entry is not None:  # that was its last copy
                    self._exits.drop(key, entry, left=pos, why="corrupt")
