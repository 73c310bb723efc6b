"""Blocks that a tier found damaged on its own (the disk tier: keys on damaged LMDB pages,
values with a bad header): dropped from that tier and counted as corrupt with their cause,
as a checksum that fails is (:meth:`~kvstore.store.reader.Reader.read`)."""

from __future__ import annotations

import logging

from kvstore.store.counters import Tally
from kvstore.store.exits import Exits
from kvstore.store.ledger import Ledger
from kvstore.store.stack import TierStack
from kvstore.tiers.base import FindsDamage

log = logging.getLogger("kvstore.store")


class DamageSweep:
    """Takes what the tiers that find damage found and settles it in the index and the
    counters. Called under the store lock."""

    def __init__(self, stack: TierStack, ledger: Ledger, exits: Exits, tally: Tally) -> None:
        self._sources = [(pos, tier) for pos, tier in enumerate(stack.tiers)
                         if isinstance(tier, FindsDamage)]
        self._ledger = ledger
        self._exits = exits
        self._tally = tally

    def sweep(self) -> None:
        """Drop the copy of each block found damaged since the last sweep (the block leaves
        the store if that was its last copy) and count it corrupt, by cause. The tier has
        logged it (once)."""
        for pos, tier in self._sources:
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
