"""Sampled eviction: LRU or LFU-DA without a Python object per block, for tiers too large to
order exactly (disk: tens of millions of blocks).

The policy keeps one 64-bit score per block it was told about in a
:class:`~kvstore.policy.scores.ScoreTable` (23-46 bytes per block) and never the keys
themselves: to name victims it draws a few random resident keys from the tier's own index (a
:class:`Resident`, for the disk tier its LMDB file) and names the lowest-scored of them, as
Redis does (Psounis and Prabhakar, "A randomized web-cache replacement scheme", 2001). The best
candidates not named are kept for the next call (a pool), which brings the order close to the
exact policy's: ``bench/bench_eviction.py`` measures it against LRU and LFU-DA.

Scores: ``lru``: a clock bumped on every put and hit. ``lfu``: LFU with dynamic aging as in
:mod:`kvstore.policy.lfu` (priority = age + frequency, frequency in the low 16 bits, the age
rising to the priority of the victims named; equal priorities go least recently touched
first; the frequency is capped at 255). A resident key the policy has no score for (a
block on disk since before a restart) scores 0: it goes before every block touched since.

Standalone (no tier attached: tests, the bench, memory tiers), the policy keeps its own
:class:`KeyPool` of resident keys.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence

from kvstore.policy.base import DrawsFromTier, Policy, Resident
from kvstore.policy.scores import ScoreTable
from kvstore.types import BlockKey

# lfu scores: priority (age + frequency) in the high 32 bits, then a 24-bit recency stamp so
# that equal priorities go least recently touched first (as LFU-DA's heap does), then the
# frequency in the low 8 bits
_PRIORITY_SHIFT = 32
_STAMP_MASK = (1 << 24) - 1
_FREQ_BITS = 8
_FREQ_MASK = (1 << _FREQ_BITS) - 1
RULES = ("lru", "lfu")
FOR_POLICY = {"lru": "sampled_lru", "lfu": "sampled_lfu", "s3fifo": "sampled_s3fifo",
              "sampled_lru": "sampled_lru", "sampled_lfu": "sampled_lfu",
              "sampled_s3fifo": "sampled_s3fifo"}
"""The sampled policy (a registered name) that stands in for each policy on a tier that
indexes itself (:mod:`kvstore.policy.sampled_fifo` for S3-FIFO)."""




class KeyPool:
    """A set of keys with O(1) add, remove and uniform sampling (a list and its positions)."""

    __slots__ = ("_at", "_keys")

    def __init__(self) -> None:
        self._keys: list[BlockKey] = []
        self._at: dict[BlockKey, int] = {}

    def add(self, key: BlockKey) -> None:
        if key not in self._at:
            self._at[key] = len(self._keys)
            self._keys.append(key)

    def discard(self, key: BlockKey) -> None:
        i = self._at.pop(key, None)
        if i is None:
            return
        last = self._keys.pop()
        if i < len(self._keys):
            self._keys[i] = last
            self._at[last] = i

    def sample(self, n: int, rng: random.Random) -> list[BlockKey]:
        if n >= len(self._keys):
            return list(self._keys)
        return rng.choices(self._keys, k=n)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._at


class SampledPolicy(Policy, DrawsFromTier):
    """Sampled LRU (``rule="lru"``) or LFU-DA (``rule="lfu"``): ``samples`` random resident
    keys drawn per victim wanted, the ``pool`` best unnamed candidates kept for the next call.
    Events cost one table probe; ``victims(n)`` costs about ``n * samples`` probes plus the
    tier's sampling."""

    name = "sampled"

    def __init__(self, rule: str = "lru", samples: int = 8, pool: int = 16,
                 seed: int | None = None, max_freq: int = _FREQ_MASK) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown sampled rule {rule!r}; known: {', '.join(RULES)}")
        if samples < 1 or pool < 0:
            raise ValueError(f"samples must be >= 1 and pool >= 0, got {samples}, {pool}")
        if not 1 <= max_freq <= _FREQ_MASK:
            raise ValueError(f"max_freq must be in 1..{_FREQ_MASK}, got {max_freq}")
        self.rule = rule
        self.name = f"sampled_{rule}"
        self.samples = samples
        self.pool_size = pool
        self.max_freq = max_freq
        self._scores = ScoreTable()
        self._own: KeyPool | None = KeyPool()
        self._resident: Resident = self._own
        self._clock = 0  # the last stamp given
        self._age = 0  # lfu: the priority of the last victims named
        self._pool: list[tuple[int, BlockKey]] = []  # (score when pooled, key)
        self._rng = random.Random(seed)

    def attach(self, resident: Resident) -> None:
        """Draw victims from ``resident`` (a tier that indexes itself) instead of an own pool
        of keys: the policy then keeps only scores, and ``len``/``in`` ask the tier."""
        self._own = None
        self._resident = resident

    # -- events -------------------------------------------------------------------------------
    def on_put(self, key: BlockKey, size: int) -> None:
        if self._own is not None:
            self._own.add(key)
        self._touch(key)

    def on_hit(self, key: BlockKey) -> None:
        if key in self._scores or key in self._resident:
            self._touch(key)

    def on_remove(self, key: BlockKey) -> None:
        self._scores.pop(key)
        if self._own is not None:
            self._own.discard(key)

    def on_put_many(self, keys: Sequence[BlockKey], sizes: Sequence[int]) -> None:
        if self._own is not None:
            for key in keys:
                self._own.add(key)
        self._touch_many(keys)

    def on_hit_many(self, keys: Sequence[BlockKey]) -> None:
        resident = self._resident
        scored = self._scores.get_many(keys, -1)  # scores are unsigned: -1 is "none"
        self._touch_many([k for k, s in zip(keys, scored, strict=True)
                          if s >= 0 or k in resident])

    def on_remove_many(self, keys: Sequence[BlockKey]) -> None:
        self._scores.pop_many(keys)
        if self._own is not None:
            for key in keys:
                self._own.discard(key)

    def _touch_many(self, keys: Sequence[BlockKey]) -> None:
        """:meth:`_touch` of each key in order, with one call into the score table."""
        if self.rule == "lru":
            first = self._clock + 1
            self._clock += len(keys)
            self._scores.set_many(keys, range(first, self._clock + 1))
        elif len(set(keys)) < len(keys):  # lfu, a key twice: its second touch sees the first
            for key in keys:
                self._touch(key)
        else:
            stamps = range(self._clock + 1, self._clock + len(keys) + 1)
            self._clock += len(keys)
            age, top = self._age, self.max_freq
            freqs = [min((s & _FREQ_MASK) + 1, top) for s in self._scores.get_many(keys)]
            self._scores.set_many(keys, [(age + f) << _PRIORITY_SHIFT
                                         | (c & _STAMP_MASK) << _FREQ_BITS | f
                                         for f, c in zip(freqs, stamps, strict=True)])

    def _touch(self, key: BlockKey) -> None:
        if self.rule == "lru":
            self._clock += 1
            self._scores.set(key, self._clock)
            return
        freq = min((self._scores.get(key) & _FREQ_MASK) + 1, self.max_freq)
        self._clock += 1
        self._scores.set(key, (self._age + freq) << _PRIORITY_SHIFT
                         | (self._clock & _STAMP_MASK) << _FREQ_BITS | freq)

    # -- victims ------------------------------------------------------------------------------
    def victims(self, n: int, evictable: Callable[[BlockKey], bool]) -> list[BlockKey]:
        if n <= 0 or not len(self._resident):
            return []
        resident = self._resident
        get = self._scores.get
        # candidates: the pool (scores as they were: checked below, when they come up) and
        # fresh samples
        scored = {k: s for s, k in self._pool if k in resident}
        for key in resident.sample(n * self.samples, self._rng):
            scored[key] = get(key)
        heap = [(s, k) for k, s in scored.items()]
        heapq.heapify(heap)
        out: list[BlockKey] = []
        kept: list[tuple[int, BlockKey]] = []
        while heap and len(out) < n:
            score, key = heapq.heappop(heap)
            now = get(key)
            if now != score:  # hit since it was pooled: back in at its new score
                heapq.heappush(heap, (now, key))
                continue
            kept.append((score, key))
            if evictable(key):
                out.append(key)
        if len(out) < n and len(scored) < len(resident):
            # Too few evictable keys among the samples (most are pinned): rank every resident
            # key, so that a victim is named whenever one exists. Rare, and O(resident).
            ranked = sorted((get(k), k) for k in set(resident.sample(len(resident), self._rng)))
            out = [k for _, k in ranked if evictable(k)][:n]
            kept, heap = ranked[: self.pool_size], []
        # Named keys stay candidates: until on_remove they are still the best victims.
        self._pool = kept + heapq.nsmallest(max(0, self.pool_size - len(kept)), heap)
        if out and self.rule == "lfu":
            self._age = max(self._age, get(out[-1]) >> _PRIORITY_SHIFT)
        return out

    def __len__(self) -> int:
        return len(self._resident)

    def __contains__(self, key: object) -> bool:
        return key in self._resident

    def tracked(self) -> int:
        """Keys with a score (told about since start); at most ``len(self)``."""
        return len(self._scores)

    def score_bytes(self) -> int:
        return self._scores.nbytes()


class SampledLRU(SampledPolicy):
    """:class:`SampledPolicy` with the ``lru`` rule (registered as ``sampled_lru``)."""

    def __init__(self) -> None:
        super().__init__("lru")


class SampledLFU(SampledPolicy):
    """:class:`SampledPolicy` with the ``lfu`` rule (registered as ``sampled_lfu``)."""

    def __init__(self) -> None:
        super().__init__("lfu")
