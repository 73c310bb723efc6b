"""The store's parts, built once from a config and wired to one another: each part's
constructor names the parts it may touch, and they are built in that order, so that no part
reaches one built after it.

The records every part changes (ledger, counters, pins, ghosts) and the parts that change
several of them at once (exits, checks, drift) are built and owned by
:class:`~kvstore.store.books.Books`; each active part takes the stack and the books, and
then only the active parts it calls. :class:`Parts` is what the facade
(:class:`~kvstore.store.facade.Store`) holds; none of the parts holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.config import StoreConfig
from kvstore.store.books import Books
from kvstore.store.demoter import Demoter
from kvstore.store.host_path import HostPath
from kvstore.store.lifecycle import Lifecycle
from kvstore.store.lock import StoreLock
from kvstore.store.namespaces import NamespaceBook, NamespaceLimits
from kvstore.store.placer import Placer
from kvstore.store.reader import Reader
from kvstore.store.report import Report
from kvstore.store.stack import TierStack
from kvstore.tiers import Tier


@dataclass(frozen=True, slots=True)
class Parts:
    """Every part of one store (the table in ``docs/store_api.md``, "Inside the store")."""

    stack: TierStack
    lock: StoreLock
    book: NamespaceBook
    books: Books
    placer: Placer
    reader: Reader
    host: HostPath
    report: Report
    life: Lifecycle

    @classmethod
    def build(cls, config: StoreConfig, tiers: Sequence[Tier] | None = None) -> Parts:
        """Open the tiers (``tiers``, or those ``config`` names) and build the parts over
        them (starting the demoter with ``background_demotion``). Loads nothing: the
        namespaces' file and the persistent tiers' indexes are read by the caller once the
        parts exist."""
        stack = TierStack(config.tiers, tiers)
        lock = StoreLock()
        book = NamespaceBook(config.namespaces_path, NamespaceLimits(
            config.max_namespaces, config.max_namespaces_per_tenant))
        books = Books(config, stack, book.layout_id)
        placer = Placer(stack, books)
        reader = Reader(stack, books, placer, lock)
        host = HostPath(stack, books, placer, reader, lock)
        books.checks.deletes = host.deletes  # a pinned host copy that fails is retired, not freed
        report = Report(stack, books, host)
        demoter = Demoter.settling(stack, books, placer, lock) if config.background_demotion \
            else None
        life = Lifecycle(config, stack, placer, host, demoter)
        return cls(stack, lock, book, books, placer, reader, host, report, life)
