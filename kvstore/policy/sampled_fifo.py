"""Sampled S3-FIFO: the queues of :mod:`kvstore.policy.s3fifo` without a Python object per
block, for tiers that index themselves (disk).

Each block's score (in a :class:`~kvstore.policy.scores.ScoreTable`) packs its queue (small
or main), the stamp of its (re)insertion and its hit count (0-3): a queue's FIFO order is the
order of stamps. Victims come from random resident keys drawn from the tier, as in
:mod:`kvstore.policy.sampled`: the oldest sampled key of the queue S3-FIFO would evict from
(small while it holds at least ``small_ratio`` of the tier, else main) is moved on (small ->
main, or reinserted in main with one hit less) if it was hit, else named. Keys removed from
small without a hit are remembered as fingerprints in a bounded ghost FIFO (two flat arrays),
so that a returning key goes straight to main. A resident key without a score (on disk since
before a restart) reads as the oldest main key without hits.
"""

from __future__ import annotations

import heapq
import random
from array import array
from collections.abc import Callable

from kvstore.policy.base import DrawsFromTier, Policy, Resident
from kvstore.policy.sampled import KeyPool
from kvstore.policy.scores import ScoreTable
from kvstore.types import BlockKey

_SMALL = 4  # score bit: in the small queue (0: main, so that a key without a score is main)
_FREQ = 3  # score bits: hits since (re)insertion, capped at 3
_STAMP_SHIFT = 3


class SampledS3FIFO(Policy, DrawsFromTier):
    """S3-FIFO by sampling (registered as ``sampled_s3fifo``); ``samples`` keys drawn per
    victim wanted, the ``pool`` best unnamed candidates kept for the next call."""

    name = "sampled_s3fifo"

    def __init__(self, small_ratio: float = 0.1, ghost_ratio: float = 0.9, samples: int = 8,
                 pool: int = 16, seed: int | None = None) -> None:
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio}")
        if ghost_ratio < 0.0 or samples < 1 or pool < 0:
            raise ValueError("ghost_ratio and pool must be >= 0 and samples >= 1")
        self.small_ratio = small_ratio
        self.ghost_ratio = ghost_ratio
        self.samples = samples
        self.pool_size = pool
        self._scores = ScoreTable()
        self._ghost = ScoreTable()  # key -> the sequence number of its entry in _ghost_fifo
        self._ghost_fifo = array("Q")  # fingerprints, oldest first from _ghost_start
        self._ghost_start = 0  # index of the oldest live FIFO entry
        self._ghost_seq = 0  # sequence number of the FIFO's first array slot
        self._own: KeyPool | None = KeyPool()
        self._resident: Resident = self._own
        self._small = 0  # resident keys in the small queue
        self._clock = 0
        self._pool: list[BlockKey] = []
        self._rng = random.Random(seed)

    def attach(self, resident: Resident) -> None:
        """Draw victims from ``resident`` (see :meth:`SampledPolicy.attach`)."""
        self._own = None
        self._resident = resident

    # -- events -------------------------------------------------------------------------------
    def on_put(self, key: BlockKey, size: int) -> None:
        if key in self._scores:
            self.on_hit(key)
            return
        if self._own is not None:
            self._own.add(key)
        self._clock += 1
        if key in self._ghost:
            self._ghost.pop(key)  # its fingerprint stays in the FIFO, skipped when trimmed
            self._scores.set(key, self._clock << _STAMP_SHIFT)
        else:
            self._scores.set(key, self._clock << _STAMP_SHIFT | _SMALL)
            self._small += 1

    def on_hit(self, key: BlockKey) -> None:
        value = self._scores.get(key, -1)
        if value < 0:
            if key not in self._resident:
                return
            value = 0  # resident without a score: the oldest main key
        if value & _FREQ < _FREQ:
            self._scores.set(key, value + 1)

    def on_remove(self, key: BlockKey) -> None:
        value = self._scores.get(key, -1)
        if self._own is not None:
            self._own.discard(key)
        if value < 0:
            return
        self._scores.pop(key)
        if value & _SMALL:
            self._small -= 1
            if not value & _FREQ:
                self._remember(key)

    def _remember(self, key: BlockKey) -> None:
        fifo = self._ghost_fifo
        self._ghost.set(key, self._ghost_seq + len(fifo))
        fifo.append(self._ghost.fingerprint(key))
        limit = max(1, int(self.ghost_ratio * len(self._resident)))
        while len(self._ghost) > limit and self._ghost_start < len(fifo):
            fp, seq = fifo[self._ghost_start], self._ghost_seq + self._ghost_start
            if self._ghost.get_fingerprint(fp, -1) == seq:  # else gone, or a newer entry's
                self._ghost.pop_fingerprint(fp)
            self._ghost_start += 1
        if self._ghost_start > 1024 and 2 * self._ghost_start > len(fifo):
            self._ghost_fifo = fifo[self._ghost_start:]
            self._ghost_seq += self._ghost_start
            self._ghost_start = 0

    # -- victims ------------------------------------------------------------------------------
    def victims(self, n: int, evictable: Callable[[BlockKey], bool]) -> list[BlockKey]:
        if n <= 0 or not len(self._resident):
            return []
        resident, get = self._resident, self._scores.get
        small: list[tuple[int, BlockKey]] = []
        main: list[tuple[int, BlockKey]] = []
        seen: set[BlockKey] = set()

        def draw(keys: list[BlockKey]) -> None:
            for key in keys:
                if key not in seen and key in resident:
                    seen.add(key)
                    value = get(key)
                    heapq.heappush(small if value & _SMALL else main, (value, key))

        draw(self._pool)
        draw(resident.sample(n * self.samples, self._rng))
        out: list[BlockKey] = []
        kept: list[BlockKey] = []
        small_target = max(1, round(self.small_ratio * len(resident)))
        named_small = 0
        draws = 8 * n  # more samples drawn when the queue to evict from has no candidate
        while len(out) < n:
            want_small = self._small - named_small >= small_target
            if ((want_small and not small) or (not small and not main)) and draws > 0 \
                    and len(seen) < len(resident):
                draws -= 1
                draw(resident.sample(self.samples, self._rng))
                continue
            if not small and not main:
                break
            from_small = bool(small) and (want_small or not main)
            value, key = heapq.heappop(small if from_small else main)
            if value & _FREQ:  # moved on, to main's newest end: still a candidate there
                heapq.heappush(main, (self._move_on(key, value), key))
                continue
            kept.append(key)
            if evictable(key):
                out.append(key)
                named_small += from_small
        if len(out) < n and len(seen) < len(resident):
            # most keys pinned: every resident key, oldest first (rare, O(resident))
            ranked = sorted((get(k) >> _STAMP_SHIFT, k) for k in set(
                resident.sample(len(resident), self._rng)))
            out = [k for _, k in ranked if evictable(k)][:n]
        # the best unnamed candidates of each queue stay for the next call, named ones too
        self._pool = kept + [k for _, k in heapq.nsmallest(self.pool_size, small)] + [
            k for _, k in heapq.nsmallest(self.pool_size, main)]
        return out

    def _move_on(self, key: BlockKey, value: int) -> int:
        """A hit key at the head of its queue: small -> main (count cleared), or back into
        main with one hit less. Returns its new score."""
        self._clock += 1
        if value & _SMALL:
            self._small -= 1
            now = self._clock << _STAMP_SHIFT
        else:
            now = self._clock << _STAMP_SHIFT | (value & _FREQ) - 1
        self._scores.set(key, now)
        return now

    def __len__(self) -> int:
        return len(self._resident)

    def __contains__(self, key: object) -> bool:
        return key in self._resident

    @property
    def ghost_size(self) -> int:
        return len(self._ghost)
