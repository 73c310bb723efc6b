"""The S3 tier: the shared capacity tier on any S3-compatible service (AWS, MinIO, Ceph,
SeaweedFS), one object per block (layout in ``layout.py``).

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

The parts: S3 requests in ``objects``, the write-back queue in ``writeback``, the known
blocks and the negative cache in ``known``, background deletes in ``background``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

from kvstore.errors import CapacityError, TierUnavailableError
from kvstore.tiers.base import BlockMeta, Buffer, Tier
from kvstore.tiers.s3.background import BackgroundTasks
from kvstore.tiers.s3.client import S3Settings
from kvstore.tiers.s3.health import Prober, S3Health
from kvstore.tiers.s3.known import KnownBlocks
from kvstore.tiers.s3.objects import S3Objects
from kvstore.tiers.s3.writeback import WriteBack
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.s3")


class S3Tier(Tier):
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
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("gets", "hits"), 0)
        self._closed = False
        self._background = BackgroundTasks(self._writes)  # deletes that flush waits for
        self._queue = WriteBack(
            self._writes,
            self._objects.put,
            self._objects.report,
            self._on_drop,
            self._on_orphan,
            max_bytes=s.queue_bytes,
            retries=s.demote_retries,
            backoff_s=s.retry_backoff_s,
            backoff_max_s=s.retry_backoff_max_s,
        )
        self._known = KnownBlocks(
            self._objects, self._reads, self._queue.get, capacity_bytes, self._lock
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
        return self._known.used

    # -- data -----------------------------------------------------------------------------
    def put_many(self, items: Sequence[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        """Queue the blocks for upload and return. Raises ``CapacityError`` (nothing queued)
        when they would exceed capacity, ``TierUnavailableError`` (nothing queued) when the
        queue is full, the tier is closed or S3 rejected our credentials."""
        if self._closed:
            raise TierUnavailableError("s3 tier is closed")
        if self.state.auth_failed:
            raise TierUnavailableError(self.state.last_error)
        copies = [(key, bytes(buf), meta) for key, buf, meta in items]
        for key, data, meta in copies:
            if len(data) != meta.size:
                raise ValueError(
                    f"block {key[1].hex()} has {len(data)} bytes, meta says {meta.size}"
                )
        with self._lock:
            replaced = sum(m.size for k, _, _ in copies if (m := self._known.get(k)))
            used = self._known.used
            if used - replaced + sum(len(d) for _, d, _ in copies) > self.capacity_bytes:
                raise CapacityError(
                    f"s3 tier: {len(copies)} blocks do not fit ({used} of "
                    f"{self.capacity_bytes} bytes used)"
                )
            self._queue.submit(copies)  # raises when full: then nothing below happens
            for key, _, meta in copies:
                self._known.remember(key, meta)
                self._known.clear_negative(key)

    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        """Bytes of each known key: from the write-back queue while queued, else from S3
        (the batch in parallel, the caller waits once). None for unknown keys, missing or
        corrupt objects, and everything not queued while S3 is degraded."""
        out: list[bytes | None] = [None] * len(keys)
        remote: list[int] = []
        for i, key in enumerate(keys):
            p = self._queue.get(key)
            if p is not None:
                out[i] = p.data  # immutable bytes: sharing them is a copy for the caller
            elif key in self._known:
                remote.append(i)
        if remote and not self.state.degraded:
            if len(remote) == 1:  # no thread hop for a single block
                out[remote[0]] = self._get_one(keys[remote[0]])
            else:
                futures = [self._reads.submit(self._get_one, keys[i]) for i in remote]
                for i, fut in zip(remote, futures, strict=True):
                    out[i] = fut.result()
        with self._lock:
            self._counts["gets"] += len(keys)
            self._counts["hits"] += sum(b is not None for b in out)
        return out

    def contains(self, key: BlockKey) -> bool:
        """Whether this node knows the block (queued, written, scanned or discovered); no S3
        request. Use :meth:`discover` to ask S3 about blocks other nodes wrote."""
        return key in self._known or self._queue.get(key) is not None

    def delete(self, keys: Sequence[BlockKey]) -> None:
        """Forget the keys now and delete their objects in the background (eviction never
        waits for S3). A failed delete leaves an orphan object that is still a valid block."""
        with self._lock:
            for key in keys:
                self._known.forget(key)
        self._queue.cancel(keys)
        if keys:
            self._background.submit(self._delete_objects, list(keys))

    def discover(self, keys: Sequence[BlockKey], *, prefix: bool = False) -> list[BlockMeta | None]:
        """Meta of each key that S3 holds, adopting blocks other nodes wrote: they become
        known (``contains`` is True, ``used_bytes`` counts them) as long as they fit in
        ``capacity_bytes``; a block that would not fit is answered None and counted in
        ``over_capacity``. Unknown keys are HEADed in parallel; a "not there" answer is cached
        for ``negative_ttl_s`` so a miss storm costs one request per key per TTL. While
        degraded, unknown keys answer None.

        ``prefix=True`` is for hash chains: keys are asked in windows of ``2 * max_workers``
        and asking stops after the first window with a miss, so the lookup of a long chain
        that S3 holds only the start of costs a window, not a HEAD per block."""
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
        return {
            "ok": not snap["degraded"],
            "backend": "s3",
            "endpoint": self.settings.endpoint_url or "aws",
            "bucket": self.settings.bucket,
            "prefix": self.settings.key_prefix,
            **snap,
            **self._queue.stats(),
        }

    def stats(self) -> dict[str, Any]:
        """Health plus traffic counters: ``gets``/``hits`` (blocks), ``discovered`` (blocks
        adopted from other nodes), ``negative_hits``, ``over_capacity`` (found but not adopted),
        ``blocks`` and ``used_bytes``."""
        with self._lock:
            counts = {**self._counts, **self._known.counts}
            counts.update(blocks=len(self._known), used_bytes=self._known.used)
        return {**self.health(), **counts}

    def probe(self) -> bool:
        """Ask S3 once whether the bucket serves (a one-key listing: unlike HEAD it carries
        an error code, so bad credentials are named). Creates the bucket if configured."""
        return self._objects.probe()

    def flush(self) -> None:
        """Wait (up to ``flush_timeout_s`` in all) until the write-back queue is empty and
        background deletes are done."""
        deadline = time.monotonic() + self.settings.flush_timeout_s
        drained = self._queue.wait_idle(self.settings.flush_timeout_s)
        remaining_s = max(0.0, deadline - time.monotonic())
        drained = self._background.wait_idle(remaining_s) and drained
        if not drained:
            log.warning("s3 tier flush timed out with %s", self._queue.stats())

    def close(self) -> None:
        """Drain the queue (bounded by ``flush_timeout_s``), then stop. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._background.close()
        self._queue.abandon()  # anything still failing drops now instead of backing off
        self._prober.close()
        self._writes.shutdown(wait=True)
        self._reads.shutdown(wait=True)
        self._objects.close()

    # -- S3 calls (pool threads) ----------------------------------------------------------
    def _get_one(self, key: BlockKey) -> bytes | None:
        body, missing = self._objects.get(key)
        if missing:
            with self._lock:  # gone (evicted by another node): stop claiming it
                if self._queue.get(key) is None:
                    self._known.forget(key)
        return body

    def _delete_objects(self, keys: list[BlockKey]) -> None:
        with self._lock:  # a key put again since its delete was scheduled must survive
            gone = [k for k in keys if not self.contains(k)]
        self._objects.delete(gone)

    # -- bookkeeping ----------------------------------------------------------------------
    def _on_drop(self, key: BlockKey) -> None:
        self.state.count("dropped")
        with self._lock:
            if self._queue.get(key) is None:  # not put again meanwhile
                self._known.forget(key)

    def _on_orphan(self, key: BlockKey) -> None:
        self._background.submit(self._delete_objects, [key])
