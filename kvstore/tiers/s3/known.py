"""How one node learns what an S3 bucket that several nodes share holds.

A node knows a block when it wrote it, found it in the start-up :meth:`KnownBlocks.scan`, or
adopted it in :meth:`KnownBlocks.discover`, which HEADs (in parallel) keys it does not know
yet, so that a block another node wrote is found: the HEAD of a block's key answers with its
meta and where its bytes are (its own object, or a member of a group: see ``layout``). A "not
there" answer is cached for ``negative_ttl_s`` (the negative cache), so a miss storm costs one
request per key per TTL.

What is known lives in :class:`~kvstore.tiers.s3.holdings.Holdings`; its ``used`` counts the
blocks this node knows, not the whole bucket: several nodes share one bucket, each charging
its own view against its own capacity, and one node's eviction deletes an object that another
node may still list (that node then reads a miss and forgets it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3.catalog_counts import CatalogLock
from kvstore.tiers.s3.holdings import Holdings
from kvstore.tiers.s3.layout import MAX_GROUP_BLOCKS, Group, Where
from kvstore.tiers.s3.objects import S3Objects
from kvstore.types import BlockKey


@dataclass(slots=True)
class FoundCounts:
    """Blocks adopted from other nodes (``discovered``), blocks a cached "not in S3" answered
    for (``negative_hits``), and blocks found but not adopted for want of room
    (``over_capacity``)."""

    discovered: int = 0
    negative_hits: int = 0
    over_capacity: int = 0

_NEGATIVE_CACHE_MAX = 100_000  # entries before expired ones are pruned


class KnownBlocks:
    """Discovery, the start-up scan and the negative cache over ``held`` (the tier's
    :class:`Holdings`), with the sharing counters (``discovered``, ``negative_hits``,
    ``over_capacity``).

    ``lock`` is the tier's lock, which also guards ``held``: hold it for
    :meth:`clear_negative` and :meth:`mark_missing`; :meth:`discover` and :meth:`scan` take
    it themselves (call them without it). ``reads`` is the pool that runs the HEADs."""

    def __init__(
        self,
        objects: S3Objects,
        reads: Executor,
        held: Holdings,
        capacity_bytes: int,
        lock: CatalogLock,
    ) -> None:
        self._objects = objects
        self._reads = reads
        self.held = held
        self._capacity_bytes = capacity_bytes
        self._lock = lock
        self._negative: dict[BlockKey, float] = {}  # key -> monotonic expiry of "not in S3"
        self.counts = FoundCounts()

    def clear_negative(self, key: BlockKey) -> None:
        """Drop a cached "not in S3" answer (this node just wrote the key). Caller holds
        ``lock``."""
        self._negative.pop(key, None)

    def mark_missing(self, key: BlockKey) -> None:
        """Cache "not in S3" for a key whose bytes turned out to be gone (a pointer whose
        group was deleted), so discovery does not adopt it again at once. Caller holds
        ``lock``."""
        self._negative[key] = time.monotonic() + self._objects.settings.negative_ttl_s

    # -- learning more --------------------------------------------------------------------
    def discover(self, keys: Sequence[BlockKey], *, prefix: bool = False) -> list[BlockMeta | None]:
        """:meth:`S3Tier.discover <kvstore.tiers.s3.tier.S3Tier.discover>`: meta of each key that
        S3 holds, adopting what fits in capacity; ``prefix=True`` stops after the first
        window of ``2 * max_workers`` keys with a miss."""
        if not prefix:
            return self._discover(keys)
        out: list[BlockMeta | None] = [None] * len(keys)
        window = 2 * self._objects.settings.max_workers
        for start in range(0, len(keys), window):
            chunk = keys[start : start + window]
            self._find_runs(chunk, keys[start:])
            end = self._prefix_end(chunk)  # blocks after a known miss cannot extend the prefix
            metas = self._discover(chunk[:end]) + [None] * (len(chunk) - end)
            out[start : start + len(metas)] = metas
            if any(m is None for m in metas):
                break
        return out

    def _prefix_end(self, chunk: Sequence[BlockKey]) -> int:
        """Index of the first key of ``chunk`` known not to be in S3 (else its length)."""
        now = time.monotonic()
        for i, key in enumerate(chunk):
            if key not in self.held and self._negative.get(key, 0.0) > now:
                return i
        return len(chunk)

    def _find_runs(self, chunk: Sequence[BlockKey], chain: Sequence[BlockKey]) -> None:
        """Learn whole runs of the chain with few requests: HEAD every ``group_blocks``-th
        unknown key of ``chunk`` and its last one (up to the first known miss), then the
        group objects their pointers name; every block of ``chain`` that those objects list
        is adopted without a HEAD of its own. A probe S3 answers "not there" is cached as a
        miss. The caller HEADs what is still unknown."""
        step = self._objects.settings.group_blocks
        unknown = [k for k in chunk[: self._prefix_end(chunk)] if k not in self.held]
        if step == 1 or not unknown or self._objects.health.degraded:
            return
        # every step-th key, and the last: a run that ends the chunk is found whole even when
        # it starts before it (a chain that starts inside a group)
        probes = unknown[::step] + ([unknown[-1]] if (len(unknown) - 1) % step else [])
        heads = list(self._reads.map(self._objects.head_group, probes))
        groups: dict[BlockKey, Group] = {}
        named: set[BlockKey] = set()
        for key, (found, group, _) in zip(probes, heads, strict=True):
            if group is not None:
                groups[key] = group
            elif found is not None and found[1].group != key:
                named.add(found[1].group)
        named -= set(groups)
        if named:
            more = list(self._reads.map(self._objects.head_group, sorted(named)))
            groups.update({n: g for n, (_, g, _) in zip(sorted(named), more, strict=True) if g})
        where: dict[BlockKey, tuple[BlockMeta, Where]] = {}
        for name, group in groups.items():
            for pos, (h, csum) in enumerate(zip(group.hashes, group.sums, strict=True)):
                meta = BlockMeta(group.layout_id, csum, group.size)
                where[(name[0], h)] = (meta, Where(name, pos))
        for key, (found, _, _) in zip(probes, heads, strict=True):
            if found is not None:
                where.setdefault(key, found)
        expiry = time.monotonic() + self._objects.settings.negative_ttl_s
        with self._lock:  # a listed run reaches at most a group's length past the chunk
            for key in chain[: len(chunk) + MAX_GROUP_BLOCKS] if where else ():
                if key in where and key not in self.held:
                    self._adopt(key, *where[key])
            for key, (found, _, definitive) in zip(probes, heads, strict=True):
                if found is None and definitive:
                    self._negative[key] = expiry

    def _adopt(self, key: BlockKey, meta: BlockMeta, where: Where) -> bool:
        """Hold a block another node wrote if it fits. Caller holds ``lock``."""
        if self.held.used + meta.size > self._capacity_bytes:
            self.counts.over_capacity += 1
            return False
        self.held.hold(key, meta, where)
        self.held.adopted(key, meta)
        self.counts.discovered += 1
        return True

    def _discover(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        out: list[BlockMeta | None] = [None] * len(keys)
        ask: list[int] = []
        now = time.monotonic()
        negative_hits = 0
        for i, key in enumerate(keys):
            meta = self.held.get(key)
            if meta is not None:
                out[i] = meta
            elif self._negative.get(key, 0.0) > now:
                negative_hits += 1
            else:
                ask.append(i)
        if ask and not self._objects.health.degraded:
            head = self._objects.head
            if len(ask) == 1:
                answers = [head(keys[ask[0]])]
            else:
                answers = list(self._reads.map(head, [keys[i] for i in ask]))
            expiry = time.monotonic() + self._objects.settings.negative_ttl_s
            with self._lock:
                for i, (found, definitive) in zip(ask, answers, strict=True):
                    key = keys[i]
                    if found is not None:
                        if key not in self.held and not self._adopt(key, *found):
                            continue
                        out[i] = found[0]
                    elif definitive:
                        self._negative[key] = expiry
                self._prune_negative(now)
        with self._lock:
            self.counts.negative_hits += negative_hits
        return out

    def scan(self) -> Iterator[tuple[BlockKey, BlockMeta]]:
        """:meth:`S3Tier.scan <kvstore.tiers.s3.tier.S3Tier.scan>`: remember and yield every
        block under the prefix (nothing when ``scan_on_start`` is off or S3 is degraded)."""
        objects = self._objects
        if not objects.settings.scan_on_start or objects.health.degraded:
            return
        try:
            for keys in objects.list_keys():
                heads = self._reads.map(objects.head, keys)
                for key, (found, _) in zip(keys, heads, strict=True):
                    if found is None:
                        continue
                    meta, where = found
                    with self._lock:
                        before = self.held.find(key)
                        if before != (meta, where):
                            self.held.hold(key, meta, where)
                        if before is None:
                            self.held.adopted(key, meta)
                    yield key, meta
        except Exception as exc:  # listing failed: report, keep what we have
            objects.report(exc)

    def _prune_negative(self, now: float) -> None:
        """Caller holds ``lock``."""
        if len(self._negative) > _NEGATIVE_CACHE_MAX:
            self._negative = {k: t for k, t in self._negative.items() if t > now}
