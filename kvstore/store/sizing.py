"""The store's what-if trackers: one :class:`~kvstore.whatif.WhatIfTracker` per tier, fed with
the requests the tier sees and the blocks that enter it, so that each tier can say what hit
rate it would have at other capacities (``Store.whatif``, ``GET /v1/whatif``).

What a tier sees, as the stats count it. A get is a request to each tier down to the one that
served it (a miss asks every tier); the blocks after the stored prefix of a lookup are
requests that every tier missed (an engine looks a prompt's chain up, reads the hit and
computes the rest, so its misses are seen only there). A block entering a tier without a
request (a put, a demotion from above, a write-through copy, a prefetch) becomes the most
recent there and counts in no hit rate. A promotion after a counted read is not fed: the read
itself made the block the most recent in the tier it was promoted to.

Not thread-safe: every method expects the store lock to be held (the ledger calls
:meth:`Sizing.entered` from its one method that adds copies).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from kvstore.namespace import Namespace
from kvstore.types import BlockKey
from kvstore.whatif import Curve, WhatIfConfig, WhatIfTracker
from kvstore.whatif.advice import Advice, Share, advise
from kvstore.whatif.sampler import SpatialSampler


class Sizing:
    """What-if trackers of the tiers named ``names`` (capacities ``capacities``, policies
    ``policies``, a fill of ``fills`` of a capacity when full, ``charges``: the bytes each
    charges a block of a size, whole slots in a slab), each built from ``config``; with
    ``config`` None nothing is tracked and :meth:`curve` raises ``LookupError``."""

    def __init__(self, names: Sequence[str], capacities: Sequence[int], policies: Sequence[str],
                 fills: Sequence[float], charges: Sequence[Callable[[int], int]],
                 config: WhatIfConfig | None) -> None:
        self.names = list(names)
        self._charges = list(charges)
        self.trackers: list[WhatIfTracker] = [] if config is None else [
            WhatIfTracker(name, capacity, policy, dataclasses.replace(config, fill=fill))
            for name, capacity, policy, fill in zip(names, capacities, policies, fills,
                                                    strict=True)]
        self._block_bytes: dict[str, list[int]] = {}  # namespace -> a block's charge per tier
        self._block_tokens: dict[str, int] = {}
        self._muted: set[int] = set()
        # the loosest tracker's test (see missed)
        self._loose = SpatialSampler(1.0, config is None or config.uniform_hashes)
        self.since = time.monotonic()  # start of the window the curves cover

    @property
    def enabled(self) -> bool:
        return bool(self.trackers)

    # -- namespaces --------------------------------------------------------------------------
    def registered(self, ns: Namespace) -> None:
        self._block_bytes[ns.name] = [charge(ns.block_bytes) for charge in self._charges]
        self._block_tokens[ns.name] = ns.layout.block_size

    def forget_namespace(self, name: str) -> None:
        self._block_bytes.pop(name, None)
        self._block_tokens.pop(name, None)
        for tracker in self.trackers:
            tracker.forget_namespace(name)

    def block_tokens(self, name: str) -> int:
        """Tokens per block of namespace ``name`` (its layout's ``block_size``; 0: unknown)."""
        return self._block_tokens.get(name, 0)

    # -- feeding -----------------------------------------------------------------------------
    def reads(self, keys: Sequence[BlockKey], served_by: Sequence[int]) -> None:
        """A get of ``keys``: ``served_by[i]`` the tier that served block ``i`` (-1: a miss)."""
        if not self.trackers or not keys:
            return
        bottom = len(self.trackers) - 1
        for pos, tracker in enumerate(self.trackers):
            groups: dict[str, tuple[list[bytes], list[bool]]] = defaultdict(lambda: ([], []))
            for (ns, h), by in zip(keys, served_by, strict=True):
                if (by if by >= 0 else bottom) >= pos:
                    hashes, hits = groups[ns]
                    hashes.append(h)
                    hits.append(by == pos)
            for ns, (hashes, hits) in groups.items():
                sizes = self._block_bytes.get(ns)
                if sizes is not None:
                    tracker.access_many(ns, hashes, sizes[pos], hits)

    def missed(self, namespace: str, hashes: Sequence[bytes]) -> None:
        """The blocks after the stored prefix of a lookup: every tier missed them."""
        sizes = self._block_bytes.get(namespace)
        if not self.trackers or sizes is None or not hashes:
            return
        misses = [False] * len(hashes)
        # the same run for every tier: tested once, at the loosest of the trackers' limits
        self._loose.set_limit(max(t.sample_limit for t in self.trackers))
        candidates = self._loose.picks(hashes)
        for tracker, size in zip(self.trackers, sizes, strict=True):
            tracker.access_many(namespace, hashes, size, misses, candidates)

    def entered(self, pos: int, keys: Sequence[BlockKey]) -> None:
        """Copies of ``keys`` landed in tier ``pos`` (the ledger's every new copy)."""
        if not self.trackers or pos in self._muted or not keys:
            return
        groups: dict[str, list[bytes]] = defaultdict(list)
        for ns, h in keys:
            groups[ns].append(h)
        tracker = self.trackers[pos]
        for ns, hashes in groups.items():
            sizes = self._block_bytes.get(ns)
            if sizes is not None:
                tracker.insert_many(ns, hashes, sizes[pos])

    @contextmanager
    def muted(self, pos: int) -> Iterator[None]:
        """Copies into tier ``pos`` are not fed meanwhile (the promotions of a counted read)."""
        if pos in self._muted:
            yield
            return
        self._muted.add(pos)
        try:
            yield
        finally:
            self._muted.discard(pos)

    def reset(self) -> None:
        """Forget every request: the curves start again from now."""
        for tracker in self.trackers:
            tracker.reset()
        self.since = time.monotonic()

    # -- asking ------------------------------------------------------------------------------
    def tracker(self, tier: str) -> WhatIfTracker:
        """The tracker of tier ``tier``; ``LookupError`` if there is none."""
        if not self.trackers:
            raise LookupError("what-if curves are off (whatif_sample_rate is 0)")
        if tier not in self.names:
            raise LookupError(f"no tier {tier!r}; tiers: {', '.join(self.names)}")
        return self.trackers[self.names.index(tier)]

    def curve(self, tier: str, namespaces: Sequence[str] | None = None,
              policy: str | None = None) -> Curve:
        """The curve of ``tier`` for ``namespaces`` (None: all) and ``policy`` (None: the
        tier's). ``LookupError`` for an unknown tier, ``ValueError`` for a policy the tracker
        cannot answer for."""
        return self.tracker(tier).curve(namespaces, policy)

    def advise(self, tier: str, namespaces: Sequence[str] | None = None,
               policy: str | None = None, prefill_tokens_per_s: float | None = None) -> Advice:
        """What more capacity in ``tier`` would save the requests of ``namespaces`` (None:
        all) at today's traffic (:mod:`kvstore.whatif.advice`); errors as :meth:`curve`."""
        tracker = self.tracker(tier)
        whole = tracker.curve(namespaces, policy)
        scope = tracker.namespaces() if namespaces is None else [
            n for n in namespaces if n in tracker.namespaces()]
        shares = [Share(n, tracker.curve([n], policy), self.block_tokens(n)) for n in scope]
        return advise(whole, shares, time.monotonic() - self.since, prefill_tokens_per_s)
