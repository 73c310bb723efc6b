"""The store's parts, built once from a config and wired to one another: each part's
constructor names the parts it may touch, and they are built in that order, so that no part
reaches one built after it.

:class:`Parts` is what the facade (:class:`~kvstore.store.facade.Store`) and its lifecycle
(:class:`~kvstore.store.lifecycle.Lifecycle`) hold; none of the parts holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.config import StoreConfig
from kvstore.policy import make_tier_policy
from kvstore.store.cold import ColdIndex
from kvstore.store.counters import Tally
from kvstore.store.damage import DamageSweep
from kvstore.store.exits import Exits
from kvstore.store.ghosts import Ghosts
from kvstore.store.host_path import HostPath
from kvstore.store.leases import LeaseTable
from kvstore.store.ledger import Ledger
from kvstore.store.lock import StoreLock
from kvstore.store.namespaces import NamespaceBook, NamespaceLimits
from kvstore.store.placer import Placer
from kvstore.store.reader import Reader
from kvstore.store.report import Report
from kvstore.store.shared import SharedChanges
from kvstore.store.stack import TierStack
from kvstore.store.tier_writer import TierWriter
from kvstore.store.verify import Checks
from kvstore.tiers import Tier
from kvstore.tiers.base import IndexedTier


@dataclass(frozen=True, slots=True)
class Parts:
    """Every part of one store (the table in ``docs/store_api.md``, "Inside the store")."""

    stack: TierStack
    lock: StoreLock
    book: NamespaceBook
    ledger: Ledger
    tally: Tally
    leases: LeaseTable
    ghosts: Ghosts
    exits: Exits
    writer: TierWriter
    placer: Placer
    reader: Reader
    host: HostPath
    report: Report
    checks: Checks

    @classmethod
    def build(cls, config: StoreConfig, tiers: Sequence[Tier] | None = None) -> Parts:
        """Open the tiers (``tiers``, or those ``config`` names) and build the parts over
        them. Loads nothing: the namespaces' file and the persistent tiers' indexes are read
        by the caller once the parts exist."""
        stack = TierStack(config.tiers, tiers)
        lock = StoreLock()
        book = NamespaceBook(config.namespaces_path, NamespaceLimits(
            config.max_namespaces, config.max_namespaces_per_tenant))
        cold = ColdIndex([(p, t) for p, t in enumerate(stack.tiers)
                          if isinstance(t, IndexedTier)], book.layout_id)
        ledger = Ledger([make_tier_policy(c.policy, t) for c, t in zip(
            config.tiers, stack.tiers, strict=True)], stack.top_name_by_mask, cold)
        tally = Tally(len(stack))
        leases = LeaseTable(quota=config.max_pinned_bytes_per_tenant,
                            default_s=config.default_lease_s, max_s=config.max_lease_s)
        ghosts = Ghosts(config.ghost_entries)
        exits = Exits(stack, ledger, leases, ghosts)
        writer = TierWriter(stack, ledger)
        changes = SharedChanges(stack, ledger, exits, tally)
        checks = Checks(stack, ledger, exits, tally)
        placer = Placer(stack, ledger, tally, leases, exits, writer, changes, checks)
        damage = DamageSweep(stack, ledger, exits, tally)
        reader = Reader(stack, ledger, placer, exits, tally, leases, lock, book, changes, checks,
                        damage)
        host = HostPath(stack, ledger, placer, exits, reader, tally, leases, lock, checks)
        checks.deletes = host.deletes  # a pinned host copy that fails is retired, not freed
        report = Report(stack, ledger, tally, leases, host, ghosts, lock, damage)
        return cls(stack, lock, book, ledger, tally, leases, ghosts, exits, writer, placer, reader,
                   host, report, checks)
