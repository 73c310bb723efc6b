"""Deleting published blocks, and the host slots of deleted blocks a reader still has pinned.

A shared-memory reader holds extents of the host slab, not bytes: if a block it pinned is
deleted and its slots freed, a block stored there after the delete would be what the reader
copies. So the host slots of a pinned block being deleted are retired instead of freed: kept,
unreadable, under a placeholder key, until the reader's pin would have expired.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvstore.store.index import Entry
from kvstore.store.stack import TierStack
from kvstore.types import BlockKey

if TYPE_CHECKING:  # the books build the checks, which name this part's type
    from kvstore.store.books import Books

RETIRED_NS = "\x00retired"  # placeholder keys of deleted blocks' slots; no namespace has NUL


class Deletes:
    """Deletes blocks (``delete``, a namespace going away) and owns the retired host slots.
    ``next_ids(n)`` reserves placeholder numbers (shared with the staged places). Every
    method expects the store lock to be held."""

    def __init__(self, stack: TierStack, books: Books, next_ids: Callable[[int], int]) -> None:
        self._stack = stack
        self._ledger, self._exits, self._leases = books.ledger, books.exits, books.leases
        self._next_ids = next_ids
        # host slots of deleted blocks a reader may still copy: (free after, placeholder key)
        self._retired: list[tuple[float, BlockKey]] = []

    def delete_blocks(self, keys: Sequence[BlockKey], *, remember: bool = True) -> int:
        """Remove published blocks from every tier, one tier call per tier; how many existed.
        The host slots of a block a reader has pinned are retired, not freed. With
        ``remember``, each leaves a ghost."""
        host = self._stack.host
        live: list[BlockKey] = []
        for key in dict.fromkeys(keys):
            entry = self._ledger.get(key)
            if entry is not None and not entry.pending:
                live.append(key)
        if remember:  # before retiring: a ghost names the top tier the block was in
            self._exits.remember(live, "deleted")
        for key in live:
            entry = self._ledger.get(key)
            if host is not None and entry is not None and entry.holds(host) \
                    and self._leases.is_pinned(key):
                self._retire(host, key, entry)
        self._exits.drop_many(live)
        for key in live:
            self._stack.forget(key)
        return len(live)

    def _retire(self, host: int, key: BlockKey, entry: Entry) -> None:
        """Keep ``key``'s host slots under a placeholder until its pin would have expired."""
        placeholder = (RETIRED_NS, str(self._next_ids(1)).encode())
        self._stack.slab().retire(key, placeholder)
        self._retired.append((self._leases.until(key), placeholder))
        self._ledger.drop_copy(host, key, entry)

    def places(self) -> list[BlockKey]:
        """The placeholder keys of every retired slot."""
        return [placeholder for _, placeholder in self._retired]

    def free_retired(self, now: float) -> None:
        """Free the retired slots whose pins would have expired by ``now``."""
        keep = []
        for until, placeholder in self._retired:
            if until <= now:
                self._stack.slab().unreserve(placeholder)
            else:
                keep.append((until, placeholder))
        self._retired = keep
