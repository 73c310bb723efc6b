"""One tier's live what-if tracker: fed every block request the tier sees, it answers the hit
rate the tier would have at capacities from ``low`` to ``high`` times today's, for the whole
tier or any set of its namespaces (a namespace, a tenant's namespaces).

How. Blocks are sampled by hash (:mod:`.sampler`); a request for an unsampled block costs one
comparison and a counter. For a sampled block the tracker measures its LRU reuse distance in
bytes over the sampled keys (:mod:`.stack`), scales it by ``1 / rate`` (plus the block's own
size: the distinct bytes between two reads of a block, then the block itself) and adds it to
the histogram of the block's namespace (:mod:`.histogram`); the policies that reuse distances
cannot describe run as miniature caches on the same sampled stream (:mod:`.minisim`). The
curves of a namespace are what the *shared* tier at each capacity would give that namespace's
requests: distances are measured in the whole tier's stream, and a scope's curve adds up the
histograms or hit counts of its namespaces.

Each sampled request stands for ``1 / rate`` requests (its weight, taken at the rate of the
moment, which is what rescaling a fixed-size SHARDS histogram amounts to). The sample's excess
or shortfall of requests against the count the tracker saw is counted as
:mod:`.estimate` says (``adjust``: a regression on the blocks' request counts by default,
SHARDS_adj on demand).

Memory. Per tracked key: about 110 bytes of fingerprint map and 32 of slot arrays
(:mod:`.tracked`), 32 to 48 of reuse stack (:mod:`.stack`): 165 to 185 bytes measured
(CPython 3.11, 30,000 to 262,144 keys, and 176 for a tracker held at 16,384 keys over 200,000
distinct blocks), so 200 is the bound we state; while the stack is compacted a moment's peak
reaches about 260. With ``max_keys`` (the default, 131,072) the tracked keys never pass it,
whatever the number of distinct blocks: 26 MB per tier at most (34 MB at the peak of a
compaction). Per namespace a histogram of ``32 * bins`` bytes (12 KB with the defaults). The
miniature caches hold at most ``capacity * rate`` bytes of blocks each (:mod:`.minisim`).

Thread safety: none of its own. The store feeds it and reads curves under its lock, as it
calls the tier's policy.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvstore.whatif.config import HIST_MARGIN, WhatIfConfig
from kvstore.whatif.estimate import Sums, hit_rates
from kvstore.whatif.histogram import DistanceHistogram
from kvstore.whatif.minisim import MiniSims
from kvstore.whatif.result import Curve, Method, Point, interpolate
from kvstore.whatif.sampler import SpatialSampler
from kvstore.whatif.stack import ReuseStack
from kvstore.whatif.tracked import TrackedKeys

_M64 = (1 << 64) - 1
_DROP = 1 / 16  # share of the tracked keys a fixed-size tracker drops when it passes its bound
_DICT_BYTES_PER_KEY = 110  # fingerprint map entry and its two ints (CPython 3.11, measured)


@dataclass(slots=True, eq=False)
class _Space:
    """One namespace's share of the tier's stream."""

    name: str
    index: int
    tag: int  # XORed into sample values: the same hash in two namespaces is two keys
    hist: DistanceHistogram
    mini: dict[str, list[float]]  # policy -> weight of the hits at each point
    mini_heavy: dict[str, list[float]]  # policy -> heavy weight of the hits at each point
    accesses: int = 0  # requests, sampled or not (N)
    sampled: int = 0  # sampled requests
    weight: float = 0.0  # sum of 1 / rate over the sampled requests (W)
    heavy: float = 0.0  # sum of count**2 / rate over them (kvstore.whatif.estimate)
    judged: int = 0  # requests whose real outcome the feeder gave
    observed: int = 0  # of those, hits


def _tag(namespace: str) -> int:
    return int.from_bytes(hashlib.sha256(namespace.encode()).digest()[:8], "big")


class WhatIfTracker:
    """Miss-ratio curves of one tier of ``capacity_bytes`` whose eviction policy is ``policy``.

    Feed it with :meth:`access_many` (requests: a read of a block, a put of a new one) and
    :meth:`insert_many` (blocks entering the tier without a request: demotions into a lower
    tier); ask it with :meth:`curve`; :meth:`reset` forgets everything (with the stats),
    :meth:`forget_namespace` one namespace.
    """

    def __init__(self, tier: str, capacity_bytes: int, policy: str = "lru",
                 config: WhatIfConfig | None = None) -> None:
        self.config = config = config if config is not None else WhatIfConfig()
        self.tier, self.policy, self.capacity_bytes = tier, policy, capacity_bytes
        self.capacities = config.capacities(capacity_bytes)  # what the points are labelled
        self._held = [max(1, round(c * config.fill)) for c in self.capacities]  # cache sizes
        self.simulated: tuple[str, ...] = config.policies or (
            () if policy == "lru" else (policy,))
        self._hist_range = (min(self._held) / HIST_MARGIN, max(self._held) * HIST_MARGIN)
        self.reset()

    # -- feeding -----------------------------------------------------------------------------
    def access_many(self, namespace: str, hashes: Sequence[bytes], size: int,
                    hits: Sequence[bool] | None = None,
                    candidates: Sequence[int] | None = None) -> None:
        """Requests for blocks ``hashes`` of ``namespace`` (each ``size`` bytes), in order;
        ``hits``: whether the tier served each (for the observed hit rate), when known;
        ``candidates``: positions of ``hashes`` a sampler at least as loose as this one's
        picked (:attr:`sample_limit`), so that only they are tested."""
        space = self._spaces.get(namespace) or self._new_space(namespace)
        space.accesses += len(hashes)
        if hits is not None:
            space.judged += len(hashes)
            space.observed += sum(hits)
        picks = self._sampler.picks(hashes) if candidates is None else [
            candidates[j] for j in self._sampler.picks([hashes[i] for i in candidates])]
        for i in picks:
            self._sampled(space, hashes[i], size, request=True)

    def access(self, namespace: str, block_hash: bytes, size: int,
               hit: bool | None = None) -> None:
        """:meth:`access_many` of one block."""
        self.access_many(namespace, (block_hash,), size, None if hit is None else (hit,))

    def insert_many(self, namespace: str, hashes: Sequence[bytes], size: int) -> None:
        """Blocks that entered the tier without a request (a demotion from the tier above):
        they become most recent, and count in no hit rate."""
        picks = self._sampler.picks(hashes)
        if picks:
            space = self._spaces.get(namespace) or self._new_space(namespace)
            for i in picks:
                self._sampled(space, hashes[i], size, request=False)

    def forget_namespace(self, namespace: str) -> None:
        """A deleted namespace: its keys leave the sample and its counts go."""
        space = self._spaces.pop(namespace, None)
        if space is None:
            return
        self._drop(self._keys.of_space(space.index))
        self._by_index[space.index] = None

    def reset(self) -> None:
        """Forget every request and key; the rate goes back to the configured one."""
        cfg = self.config
        self._sampler = SpatialSampler(cfg.sample_rate, cfg.uniform_hashes)
        self._keys = TrackedKeys()
        self._stack = ReuseStack()
        self._spaces: dict[str, _Space] = {}
        self._by_index: list[_Space | None] = []
        self._mini: dict[str, MiniSims] = {}  # built at the first sampled block: a tier
        # nobody uses holds no caches (a sampled policy's take ~30 KB each even empty)

    # -- asking ------------------------------------------------------------------------------
    @property
    def sample_rate(self) -> float:
        return self._sampler.rate

    @property
    def sample_limit(self) -> int:
        """Blocks whose sample value is below this are tracked (:mod:`.sampler`)."""
        return self._sampler.limit

    @property
    def tracked_keys(self) -> int:
        return len(self._keys)

    def namespaces(self) -> list[str]:
        return list(self._spaces)

    def curve(self, namespaces: Iterable[str] | None = None, policy: str | None = None,
              method: Method | None = None) -> Curve:
        """The curve of ``policy`` (default: the tier's) for the requests of ``namespaces``
        (default: all). ``method``: ``shards`` (LRU only) or ``mini`` (a simulated policy);
        by default ``shards`` for LRU, else ``mini``. Raises ``ValueError`` for a policy
        neither can answer for."""
        policy = policy or self.policy
        method = method or ("shards" if policy == "lru" else "mini")
        if method == "shards" and policy != "lru":
            raise ValueError("reuse distances describe LRU only; ask method='mini'")
        if method == "mini" and policy not in self.simulated:
            raise ValueError(f"{policy!r} is not simulated on the {self.tier} tier; "
                             f"simulated: {', '.join(self.simulated) or 'none'}")
        scope = None if namespaces is None else tuple(namespaces)
        spaces = list(self._spaces.values()) if scope is None else [
            s for s in (self._spaces.get(n) for n in scope) if s is not None]
        hits, heavy_hits = [0.0] * len(self._held), [0.0] * len(self._held)
        for s in spaces:
            light, heavy = s.hist.hits(self._held) if method == "shards" else (
                s.mini[policy], s.mini_heavy[policy])
            hits = [a + b for a, b in zip(hits, light, strict=True)]
            heavy_hits = [a + b for a, b in zip(heavy_hits, heavy, strict=True)]
        n = sum(s.accesses for s in spaces)
        rates = hit_rates(Sums(n, sum(s.weight for s in spaces), sum(s.heavy for s in spaces),
                               hits, heavy_hits), self.config.adjust)
        points = tuple(Point(c, r) for c, r in zip(self.capacities, rates, strict=True))
        judged = sum(s.judged for s in spaces)
        return Curve(self.tier, policy, method, self.sample_rate, points,
                     Point(self.capacity_bytes, interpolate(points, self.capacity_bytes)),
                     n, sum(s.sampled for s in spaces), len(self._keys),
                     sum(s.observed for s in spaces) / judged if judged else None, scope)

    def nbytes(self) -> int:
        """An estimate of the memory the tracker holds, miniature caches left out."""
        spaces = sum(s.hist.nbytes() + sys.getsizeof(s) for s in self._spaces.values())
        return (len(self._keys) * _DICT_BYTES_PER_KEY + self._keys.nbytes()
                + self._stack.nbytes() + spaces)

    # -- inside ------------------------------------------------------------------------------
    def _new_space(self, namespace: str) -> _Space:
        lo, hi = self._hist_range
        space = _Space(namespace, len(self._by_index), _tag(namespace),
                       DistanceHistogram(lo, hi, self.config.bins_per_octave),
                       {p: [0.0] * len(self._held) for p in self.simulated},
                       {p: [0.0] * len(self._held) for p in self.simulated})
        self._spaces[namespace] = space
        self._by_index.append(space)
        return space

    def _sampled(self, space: _Space, block_hash: bytes, size: int, *, request: bool) -> None:
        if len(self._mini) < len(self.simulated):
            self._mini = {p: MiniSims(p, self._held, self._sampler.rate) for p in self.simulated}
        value = self._sampler.value(block_hash)
        fp = value ^ space.tag
        slot = self._keys.slot_of.get(fp)
        new = slot is None
        if slot is None:
            slot = self._keys.add(fp, value, space.index)
        rate = self._sampler.rate
        since = self._stack.touch(slot, size)
        if request:
            count = self._keys.requested(slot)
            weight = 1.0 / rate
            heavy = weight * count * count
            space.sampled += 1
            space.weight += weight
            space.heavy += heavy
            if since is not None:
                space.hist.add(since / rate + size, weight, heavy)
            for name, sims in self._mini.items():
                sims.read(fp, size, weight, heavy, space.mini[name], space.mini_heavy[name])
        else:
            for sims in self._mini.values():
                sims.insert(fp, size)
        bound = self.config.max_keys
        if new and bound is not None and len(self._keys) > bound:
            self._lower(bound)

    def _lower(self, bound: int) -> None:
        """Fixed-size SHARDS: past ``bound`` keys, lower the limit so that the keys with the
        largest sample values (a ``_DROP`` share) leave; the rest were sampled at the new rate
        too, so their distances stay right once scaled by the new rate."""
        limit = self._keys.limit_keeping(math.floor(bound * (1 - _DROP)))
        self._sampler.set_limit(limit)
        self._drop(self._keys.at_or_above(limit))
        for sims in self._mini.values():
            sims.rescale(self._sampler.rate)

    def _drop(self, slots: list[int]) -> None:
        self._stack.remove(slots)
        fps = self._keys.remove(slots)
        self._keys.compact()  # O(keys), after at least a sixteenth of the bound was added
        for sims in self._mini.values():
            sims.remove(fps)

