"""The S3 tier: the shared capacity tier on any S3-compatible service (AWS, MinIO, Ceph,
SeaweedFS), runs of consecutive blocks grouped into one object (layout in ``layout.py``).

What it promises beyond :class:`~kvstore.tiers.base.Tier`:

- **Demotions never block on S3.** ``put_many`` copies the blocks into a bounded write-back
  queue and returns; the write pool uploads them (retrying transient faults with backoff, then
  dropping and counting). While queued, a block is served by ``get_many``/``contains``. A full
  queue raises :class:`~kvstore.errors.TierUnavailableError` so the store drops instead of
  waiting; so do known-bad credentials.
- **Reads fail soft.** ``get_many`` returns None for what it cannot read (missing, corrupt,
  S3 down); an object whose body does not match the checksum in its own metadata is counted
  in ``corrupt`` and never returned. While the back end is degraded reads answer "miss" at
  once and a probe thread brings the tier back when S3 answers again.
- **Sharing.** :meth:`S3Tier.discover` finds and adopts blocks that other nodes wrote.
  ``used_bytes`` counts the blocks this node knows, not the whole bucket (``known``).
- **It indexes itself.** What this node holds is in a local LMDB catalog (``catalog_path``;
  without one a temporary folder removed at close), not in Python objects, and the store asks
  the tier (``metas``, ``leading``, ``keys_of``, ``sample``) instead of keeping an entry per
  S3-only block (:mod:`kvstore.store.cold`); with a path a restart keeps what it knew. What
  the tier learned or lost on its own (discovery, a group found gone, an upload dropped) the
  store takes from :meth:`S3Tier.changes`.
- **Groups.** ``put_many`` writes runs of up to ``group_blocks`` consecutive blocks as one
  object and a pointer for each other member; a batch read fetches each group's members with
  one ranged GET and verifies every block alone. A deleted block stays in its object until
  the last live member dies, then the object and its pointers are deleted (``holdings``),
  or until dead members take more than ``compact_dead_share`` of the object: then its live
  members are rewritten without them (compaction, ``writer``).

The parts: the write side (puts, pointers, deletes) in ``writer`` over the write-back queue
in ``writeback`` and background deletes and pointers in ``background``, the read side in
``reader``, S3 requests in ``objects``, what this node holds and the deletion rule in
``holdings``, discovery and the negative cache in ``known``, which blocks share an object in
``grouping``. This class composes them and answers for the tier's life (health, flush, close).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from typing import Any

from kvstore.tiers.base import BlockMeta, Buffer, IndexedTier, SharedTier
from kvstore.tiers.s3.client import S3Settings
from kvstore.tiers.s3.health import Prober, S3Health
from kvstore.tiers.s3.holdings import Holdings
from kvstore.tiers.s3.known import KnownBlocks
from kvstore.tiers.s3.objects import S3Objects
from kvstore.tiers.s3.reader import S3Reader
from kvstore.tiers.s3.writer import S3Writer
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.s3")


class S3Tier(IndexedTier, SharedTier):
    """Blocks as objects in ``bucket`` under ``prefix``; options are the fields of
    :class:`~kvstore.tiers.s3.client.S3Settings` (``endpoint`` is accepted for
    ``endpoint_url``). Construction never fails because S3 is down (the tier starts degraded
    and recovers); it fails on bad options."""

    name = "s3"
    persistent = True
    verify_reads = True

    def __init__(self, capacity_bytes: int, **options: Any) -> None:
        super().__init__(capacity_bytes)
        if "endpoint" in options:  # the server's --s3-endpoint spelling
            endpoint = options.pop("endpoint")
            if options.setdefault("endpoint_url", endpoint) != endpoint:
                raise ValueError("s3 options 'endpoint' and 'endpoint_url' disagree")
        known_options = {f.name for f in fields(S3Settings)}
        unknown = sorted(set(options) - known_options)
        if unknown:
            raise ValueError(
                f"unknown s3 tier option(s) {unknown}; known: {', '.join(sorted(known_options))}"
            )
        s = self.settings = S3Settings(**options)
        self.state = S3Health()
        self._objects = S3Objects(s, self.state)
        self._reads = ThreadPoolExecutor(s.max_workers, thread_name_prefix="kvstore-s3-read")
        self._writes = ThreadPoolExecutor(s.max_workers, thread_name_prefix="kvstore-s3-write")
        self._closed = False
        self._held = Holdings(s.catalog_path, s.catalog_map_size, s.catalog_identity)
        # One lock guards the holdings and the known blocks for all the parts below; the
        # catalog writes made under it commit when it is released.
        lock = self._lock = self._held.lock
        self._known = KnownBlocks(self._objects, self._reads, self._held, capacity_bytes, lock)
        self._writer = S3Writer(
            s, self.state, self._objects, self._writes, self._held, self._known, lock,
            capacity_bytes,
        )
        self._reader = S3Reader(
            self.state, self._objects, self._reads, self._held, self._known, self._writer, lock
        )
        self.probe()
        self._prober = Prober(self.state, self.probe, s.probe_interval_s)

    @property
    def client(self) -> Any:
        """The boto3 client for data requests."""
        return self._objects.client

    @property
    def probe_client(self) -> Any:
        """The boto3 client for health probes (no retries)."""
        return self._objects.probe_client

    # -- accounting -----------------------------------------------------------------------
    def used_bytes(self) -> int:
        return self._held.used

    # -- data -----------------------------------------------------------------------------
    def put_many(self, items: Sequence[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        """Queue the blocks for upload, runs of consecutive ones as one object, and return.
        A block already held with the same meta is left as it is; a dead member of a group
        that still stores it comes back without an upload. Raises ``CapacityError`` (nothing
        queued) when they would exceed capacity, ``TierUnavailableError`` (nothing queued)
        when the queue is full, the tier is closed or S3 rejected our credentials."""
        self._writer.put_many(items)

    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        """Bytes of each known key: from the write-back queue while queued, else from S3,
        one ranged GET per group object for all the keys it holds (the groups in parallel,
        the caller waits once). None for unknown keys, missing or corrupt blocks, and
        everything not queued while S3 is degraded."""
        return self._reader.get_many(keys)

    def contains(self, key: BlockKey) -> bool:
        """Whether this node knows the block (queued, written, scanned or discovered); no S3
        request. Use :meth:`discover` to ask S3 about blocks other nodes wrote."""
        return key in self._held

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    # -- the store's index (kvstore.store.cold.IndexedTier), from the catalog -----------------
    def metas(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        """The meta of each key this node holds (None: not held), one catalog read."""
        return self._held.metas(keys)

    def leading(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """How many of a chain's ``hashes``, from the first, this node holds in S3."""
        return self._held.leading(namespace, hashes)

    def keys_of(self, namespace: str) -> list[BlockKey]:
        return self._held.keys_of(namespace)

    def namespace_usage(self) -> dict[str, tuple[int, int]]:
        """``namespace -> (blocks, payload bytes)`` this node holds, from the catalog's counts."""
        return self._held.namespace_usage()

    def sample(self, n: int, rng: random.Random) -> list[BlockKey]:
        """``n`` held keys about at random, or every one when ``n >= len(self)`` (a sampled
        eviction policy's candidates)."""
        return self._held.sample(n, rng)

    def changes(self) -> list[tuple[BlockKey, BlockMeta, bool]]:
        """Blocks that became held without a put (adopted by discovery or a scan: True) or
        stopped being held without a delete (a group found gone or replaced, an upload
        dropped: False) since the last call, net. The store accounts for them."""
        with self._lock:
            return self._held.changes()

    def delete(self, keys: Sequence[BlockKey]) -> None:
        """Forget the keys now; a group object whose last live member this was is deleted
        (with its members' pointers) in the background, or its upload cancelled (eviction
        never waits for S3). A failed delete leaves an orphan object that is still a valid
        block."""
        self._writer.delete(keys)

    def discover(self, keys: Sequence[BlockKey], *, prefix: bool = False) -> list[BlockMeta | None]:
        """Meta of each key that S3 holds, adopting blocks other nodes wrote: they become
        known (``contains`` is True, ``used_bytes`` counts them) as long as they fit in
        ``capacity_bytes``; a block that would not fit is answered None and counted in
        ``over_capacity``. Unknown keys are HEADed in parallel; a "not there" answer is cached
        for ``negative_ttl_s`` so a miss storm costs one request per key per TTL. While
        degraded, unknown keys answer None.

        ``prefix=True`` is for hash chains: keys are asked in windows of ``2 * max_workers``
        and asking stops after the first window with a miss, so the lookup of a long chain
        that S3 holds only the start of costs a window, not a HEAD per block. Within a window
        a few HEADs find the group objects of the chain's runs, whose listings answer for
        their blocks (``known.KnownBlocks``)."""
        return self._known.discover(keys, prefix=prefix)

    def scan(self) -> Iterator[tuple[BlockKey, BlockMeta]]:
        """Every block under the prefix: a paginated listing, each page HEADed in parallel
        for the metadata the listing lacks. Stops (with the error in ``health``) if S3 fails
        mid-way; blocks not scanned are still found later by :meth:`discover`."""
        return self._known.scan()

    # -- operations -----------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """``ok`` is False while degraded; ``reason`` says why (``auth``, ``no_bucket``,
        ``throttled``, ``unavailable``) and ``last_error`` says what to do."""
        snap = self.state.snapshot()
        queue = self._writer.stats()
        return {
            "ok": not snap.degraded,
            "backend": "s3",
            "endpoint": self.settings.endpoint_url or "aws",
            "bucket": self.settings.bucket,
            "prefix": self.settings.key_prefix,
            **snap._asdict(),
            **queue._asdict(),
            "uploaded": self._writer.uploaded,
            "uploaded_objects": queue.uploaded,
        }

    def stats(self) -> dict[str, Any]:
        """Health plus traffic counters: ``gets``/``hits`` (blocks), ``discovered`` (blocks
        adopted from other nodes), ``negative_hits``, ``over_capacity`` (found but not adopted),
        ``blocks``, ``used_bytes``, ``objects`` (group objects with a live block),
        ``dead_bytes`` (deleted blocks still stored beside live ones) and ``compactions``
        (group objects rewritten without their dead members)."""
        with self._lock:
            counts = {**asdict(self._reader.counts), **asdict(self._known.counts)}
            counts.update(
                blocks=len(self._held),
                used_bytes=self._held.used,
                objects=self._held.objects,
                dead_bytes=self._held.dead_bytes,
                compactions=self._writer.compactions,
                **self._held.stats(),
            )
        return {**self.health(), **counts}

    def probe(self) -> bool:
        """Ask S3 once whether the bucket serves (a one-key listing: unlike HEAD it carries
        an error code, so bad credentials are named). Creates the bucket if configured."""
        return self._objects.probe()

    def flush(self) -> None:
        """Wait (up to ``flush_timeout_s`` in all) until the write-back queue is empty and
        background deletes are done."""
        if not self._writer.wait_idle(self.settings.flush_timeout_s):
            log.warning("s3 tier flush timed out with %s", self._writer.stats())

    def close(self) -> None:
        """Drain the queue (bounded by ``flush_timeout_s``), then stop. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._writer.close()
        self._prober.close()
        self._writes.shutdown(wait=True)
        self._reads.shutdown(wait=True)
        self._objects.close()
        self._held.close()
