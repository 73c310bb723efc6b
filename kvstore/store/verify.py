"""Checksums of blocks in memory: recorded when a block is acknowledged, verified where bytes
leave, and a block that fails dropped, counted by tier and cause, and logged once.

Every block has its xxh3-64 from the moment a put or a commit acknowledges it
(:attr:`~kvstore.store.index.Entry.checksum`). A shared-memory or direct socket put hands over
bytes that are already in the host slab: they are hashed there at commit (a socket put's as
they land) and :meth:`Checks.sealed` compares with the checksum the client computed over the
bytes it meant to write, so that bytes a late writer copied into the places in between never
become the block. Reads out of
memory tiers and demotions hash what they hand on and compare with the recorded checksum
(:meth:`Checks.matches`); a block that fails is dropped from the store (:meth:`Checks.drop`).

Every method expects the store lock to be held.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from kvstore.checksum import checksums
from kvstore.store.counters import Tally
from kvstore.store.deletes import Deletes
from kvstore.store.exits import Exits
from kvstore.store.index import fmt_key
from kvstore.store.ledger import Ledger
from kvstore.store.stack import TierStack
from kvstore.tiers.base import Buffer
from kvstore.tiers.slots import Extents
from kvstore.types import BlockKey, CorruptCause

log = logging.getLogger("kvstore.store")
QUIET_S = 60.0  # a (tier, cause) that failed is logged again only after this long


class Checks:
    """Verifies blocks against their recorded checksums and drops those that fail. Owns when
    each (tier, cause) was last logged; changes the ledger and counters through their parts.
    ``deletes`` (the host path's) is set once the host path exists: a host copy that a
    reader has pinned is retired, not freed."""

    def __init__(self, stack: TierStack, ledger: Ledger, exits: Exits, tally: Tally) -> None:
        self._stack = stack
        self._ledger = ledger
        self._exits = exits
        self._tally = tally
        self.deletes: Deletes | None = None
        self._logged: dict[tuple[int, str], tuple[float, int]] = {}  # -> (when, unlogged)

    @staticmethod
    def matches(sums: Sequence[int | None], datas: Sequence[Buffer | None]) -> list[bool]:
        """Whether each block's bytes match its recorded checksum in ``sums`` (the callers
        have the entries; one batched hash call). False for a None buffer; True for a block
        with no checksum recorded (stored before checksums were kept: nothing to compare
        with)."""
        todo = [i for i, (s, d) in enumerate(zip(sums, datas, strict=True))
                if d is not None and s is not None]
        ok = [d is not None for d in datas]
        got = [d for d in (datas[i] for i in todo) if d is not None]
        for i, csum in zip(todo, checksums(got), strict=True):
            ok[i] = csum == sums[i]
        return ok

    def sealed(self, extents: Sequence[Extents], sent: Sequence[int | None] | None,
               landed: Sequence[int | None]) -> list[int | None]:
        """The checksum to record for each block just written into the slab at ``extents``:
        ``landed[i]`` (as a socket receive saw its bytes land) where given, else of its bytes
        as they lie now; None where the client's checksum (``sent``) differs: the block is
        refused. Without ``sent`` every block is taken as it is (a late copy before the
        commit cannot be told from the writer's own)."""
        got = list(landed)
        todo = [i for i, c in enumerate(got) if c is None]
        for i, csum in zip(todo, self._stack.slab().sums([extents[i] for i in todo]),
                           strict=True):
            got[i] = csum
        if sent is None:
            return got
        return [s if want is None or want == s else None
                for s, want in zip(got, sent, strict=True)]

    def check_host(self, keys: Sequence[BlockKey], cause: CorruptCause) -> int:
        """Hash the host copies of ``keys`` where they lie and drop the blocks whose bytes no
        longer match their checksum (a reader found a bad copy); how many were dropped."""
        host, slab = self._stack.host, self._stack.slab()
        assert host is not None  # slab() raised otherwise
        held = [(k, e) for k, e in zip(keys, self._ledger.get_many(list(keys)), strict=True)
                if e is not None and not e.pending and e.holds(host)]
        sums = slab.sums([slab.extents(k) for k, _ in held])
        bad = [k for (k, e), s in zip(held, sums, strict=True) if e.checksum not in (None, s)]
        self.drop(host, bad, cause)
        return len(bad)

    def drop(self, pos: int, keys: Sequence[BlockKey], cause: CorruptCause) -> None:
        """Drop blocks whose copy in tier ``pos`` failed its checksum: the whole block leaves
        the store (its other copies were made from the same bytes, or from a copy that may
        be as bad), counted as ``corrupt_dropped`` of tier ``pos`` for ``cause``, and logged
        once per (tier, cause) per :data:`QUIET_S`."""
        keys = [k for k in dict.fromkeys(keys) if self._ledger.visible(k) is not None]
        if not keys:
            return
        for key in keys:
            self._tally.corrupt(pos, key[0], cause)
        self._exits.remember(keys, "corrupt")
        if self.deletes is not None:  # retires pinned host slots (a reader may copy them)
            self.deletes.delete_blocks(keys, remember=False)
        else:
            self._exits.drop_many(keys)
        self._log(pos, keys, cause)

    def _log(self, pos: int, keys: list[BlockKey], cause: CorruptCause) -> None:
        now = time.monotonic()
        last, unlogged = self._logged.get((pos, cause), (-QUIET_S, 0))
        unlogged += len(keys)
        if now - last < QUIET_S:
            self._logged[(pos, cause)] = (last, unlogged)
            return
        self._logged[(pos, cause)] = (now, 0)
        log.error("checksum mismatch in the %s tier (%s): %d blocks dropped since the last "
                  "report, e.g. %s", self._stack.names[pos], cause, unlogged, fmt_key(keys[0]))
