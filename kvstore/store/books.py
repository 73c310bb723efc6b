"""The store's books: every record it keeps about its blocks, built and owned in one place,
and the ways those records change together.

The records are the ledger (index, policies, namespace usage), the counters, the pins, the
ghosts and the what-if trackers (sizing). Three parts change several of them at once and are
built here over them: the exits (every block's way out), the checks (a block whose checksum
fails is dropped and counted) and the drift (what tiers changed on their own). The active
parts (placer, reader, host path, demoter, report) each take the stack and the books, plus
only the active parts they call, as vLLM's single-type managers each take the one block pool.
Not thread-safe: every method expects the store lock to be held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvstore.config import StoreConfig
from kvstore.namespace import Namespace
from kvstore.policy import make_tier_policy
from kvstore.store.cold import ColdIndex
from kvstore.store.counters import Tally
from kvstore.store.drift import Drift
from kvstore.store.exits import Exits
from kvstore.store.ghosts import Ghosts
from kvstore.store.index import Entry, fmt_key
from kvstore.store.leases import LeaseTable
from kvstore.store.ledger import Ledger
from kvstore.store.sizing import Sizing
from kvstore.store.stack import TierStack
from kvstore.store.verify import Checks
from kvstore.tiers.base import IndexedTier, SharedTier

log = logging.getLogger("kvstore.store")


class Books:
    """The ledger, counters, pins and ghosts of one store, and the exits, checks and drift
    over them. ``layout_of(namespace)`` is a namespace's registered layout id (None if
    unregistered): blocks stored under another layout are not the namespace's."""

    def __init__(self, config: StoreConfig, stack: TierStack,
                 layout_of: Callable[[str], int | None]) -> None:
        self._stack = stack
        self.layout_of = layout_of
        cold = ColdIndex([(p, t) for p, t in enumerate(stack.tiers)
                          if isinstance(t, IndexedTier)], layout_of)
        policies = [make_tier_policy(c.policy, t) for c, t in zip(
            config.tiers, stack.tiers, strict=True)]
        # a sampled policy's curve is its exact rule's (LRU from reuse distances, at no cost
        # per request): replays of the bench's traces put the two at most 0.007 apart
        self.sizing = Sizing(stack.names, [c.capacity_bytes for c in config.tiers],
                             [p.name.removeprefix("sampled_") for p in policies],
                             [(c.high_watermark + c.low_watermark) / 2 for c in config.tiers],
                             [t.charge for t in stack.tiers], config.whatif)
        self.ledger = Ledger(policies, stack.top_name_by_mask, cold, self.sizing)
        self.tally = Tally(len(stack))
        self.leases = LeaseTable(quota=config.max_pinned_bytes_per_tenant,
                                 default_s=config.default_lease_s, max_s=config.max_lease_s)
        self.ghosts = Ghosts(config.ghost_entries)
        self.exits = Exits(stack, self.ledger, self.leases, self.ghosts)
        self.checks = Checks(stack, self.ledger, self.exits, self.tally)
        self.drift = Drift(stack, self.ledger, self.exits, self.tally)

    def registered(self, ns: Namespace) -> None:
        """Give a registered namespace its (zero) rows in the stats."""
        self.tally.registered(ns.name, ns.block_bytes)
        self.ledger.usage(ns.name)
        self.sizing.registered(ns)

    def forget_namespace(self, name: str) -> None:
        """A deleted namespace's blocks have all left: forget its ghosts, its usage row and
        its counters."""
        self.ghosts.forget_namespace(name)
        self.ledger.forget_usage(name)
        self.tally.forgotten(name)
        self.sizing.forget_namespace(name)

    def index_persistent(self) -> None:
        """Index every block the persistent tiers hold (at start, after a restart). Blocks
        whose layout id does not match their registered namespace are skipped: they belong to
        another definition. Shared tiers are not listed: the reader's ``discover`` asks them;
        nor are tiers that index themselves (disk): the ledger asks them when it needs a
        block."""
        for pos, tier in enumerate(self._stack.tiers):
            if not tier.persistent or isinstance(tier, SharedTier | IndexedTier):
                continue
            for key, meta in tier.scan():
                layout = self.layout_of(key[0])
                if layout is not None and meta.layout_id != layout:
                    log.warning("skipping %s: layout id differs from its namespace", fmt_key(key))
                    continue
                entry = self.ledger.get(key)
                if entry is None:
                    self.ledger.add_block(
                        key, Entry(meta.size, meta.checksum, meta.layout_id), pos)
                else:
                    self.ledger.add_copy(pos, key, entry)
