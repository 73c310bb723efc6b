"""Writing a batch into one tier: checksums filled in for tiers that keep them, and a tier's
refusals reported once per episode of failure rather than once per block.

Room is made before (:meth:`kvstore.store.placer.Placer.write`); this part only writes, and
builds a put's items (:meth:`TierWriter.new_items`, the one method called without the store
lock). :meth:`TierWriter.put` expects the store lock to be held.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from kvstore.checksum import checksums
from kvstore.errors import CapacityError, TierUnavailableError
from kvstore.namespace import Namespace
from kvstore.store.index import make_keys
from kvstore.store.ledger import Ledger
from kvstore.store.stack import TierStack
from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.types import BlockHash, BlockKey

log = logging.getLogger("kvstore.store")
Item = tuple[BlockKey, Buffer, BlockMeta]
NewItems = tuple[int, list[Item], int]  # a put's tier, its items, how many were left out
QUIET_S = 60.0  # a tier that failed is reported again only after this long without failure


class TierWriter:
    """Calls a tier's ``put_many``. Owns when each tier last failed (to log an episode once);
    reads the stack's facts and fills missing checksums into the ledger's entries."""

    def __init__(self, stack: TierStack, ledger: Ledger) -> None:
        self._stack = stack
        self._tiers = stack.tiers
        self._ledger = ledger
        self._failing: dict[int, float] = {}  # tier -> monotonic time of its last failure
        # read once: a tier's kind does not change, and a put asks for every batch
        self._sealed = [tier.needs_checksum for tier in self._tiers]

    def new_items(self, ns: Namespace, hashes: Sequence[BlockHash], blocks: Sequence[Buffer],
                  tier: str | None, sums: Sequence[int | None] | None = None
                  ) -> NewItems:
        """The tier a put of ``blocks`` lands in (``tier``, else the top one), its items, and
        how many blocks were left out because their bytes do not match the writer's checksum
        in ``sums``. Raises, before anything is stored, ``ValueError`` unless there are as many
        hashes (and sums) as blocks, then ``InvalidHashError``, ``BlockSizeError`` (each block
        must be the namespace's ``block_bytes``) and ``ValueError`` for an unknown ``tier``, in
        that order. Called without the store lock: every block's checksum is computed here,
        one batched call, so that it has one from the moment the put acknowledges it."""
        if len(hashes) != len(blocks):
            raise ValueError(f"{len(hashes)} hashes but {len(blocks)} blocks")
        if sums is not None and len(sums) != len(blocks):
            raise ValueError(f"{len(blocks)} blocks but {len(sums)} checksums")
        keys = make_keys(ns.name, hashes)
        ns.check_sizes([memoryview(block).nbytes for block in blocks])
        start = self._stack.pos(tier) if tier is not None else 0
        got = checksums(blocks)
        items = [(key, block, BlockMeta(ns.layout_id, csum, ns.block_bytes))
                 for key, block, csum in zip(keys, blocks, got, strict=True)]
        if sums is None:
            return start, items, 0
        kept = [it for it, want in zip(items, sums, strict=True)
                if want is None or want == it[2].checksum]
        return start, kept, len(items) - len(kept)

    def put(self, pos: int, items: list[Item]) -> bool:
        """Write ``items`` into tier ``pos``, which has room for them; False if it refuses.
        For a tier that keeps checksums, items without one get it computed, in ``items``
        (callers read their metas back) and in the index entry if the block has one."""
        tier = self._tiers[pos]
        if self._sealed[pos]:
            self._seal(items)
        try:
            tier.put_many(items)
        except CapacityError as exc:
            log.warning("%s tier refused %d blocks: %s", tier.name, len(items), exc)
            return False
        except TierUnavailableError as exc:
            # once per episode, not once per block: the tier's health says it meanwhile
            if pos not in self._failing:
                log.error("%s tier cannot take writes (%s); blocks that no other tier takes "
                          "are refused or dropped until it recovers", tier.name, exc)
            self._failing[pos] = time.monotonic()
            return False
        if pos in self._failing and time.monotonic() - self._failing[pos] > QUIET_S:
            del self._failing[pos]  # near the limit some writes fit: over once it holds
            log.warning("%s tier takes writes again", tier.name)
        return True

    def _seal(self, items: list[Item]) -> None:
        """Fill in missing checksums, in place."""
        todo = [i for i, (_, _, meta) in enumerate(items) if meta.checksum is None]
        if not todo:
            return
        sums = checksums([items[i][1] for i in todo])
        entries = self._ledger.get_many([items[i][0] for i in todo])
        for i, csum, entry in zip(todo, sums, entries, strict=True):
            key, data, meta = items[i]
            items[i] = (key, data, meta._replace(checksum=csum))
            if entry is not None and entry.checksum is None:
                entry.checksum = csum
