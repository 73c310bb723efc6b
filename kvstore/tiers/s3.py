"""The S3 tier: the shared capacity tier on any S3-compatible service (AWS, MinIO, Ceph,
SeaweedFS), one object per block (layout in ``s3_layout``).

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
- **Sharing.** :meth:`S3Tier.discover` HEADs (in parallel) keys that this node does not know
  yet, with a short negative cache, so a block that another node wrote is found and adopted.

``used_bytes`` counts the blocks this node knows (written, scanned or discovered), not the
whole bucket: several nodes share one bucket, each charging its own view against its own
capacity, and one node's eviction deletes an object that another node may still list (that
node then reads a miss and forgets it).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

from kvstore.checksum import checksum
from kvstore.errors import CapacityError, TierUnavailableError
from kvstore.tiers.base import BlockMeta, Buffer, Tier
from kvstore.tiers.s3_client import (
    MISSING,
    NO_BUCKET,
    S3Settings,
    classify,
    describe,
    make_client,
)
from kvstore.tiers.s3_health import Prober, S3Health
from kvstore.tiers.s3_layout import meta_headers, object_key, parse_key, parse_meta
from kvstore.tiers.s3_writeback import WriteBack
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.s3")

_NEGATIVE_CACHE_MAX = 100_000  # entries before expired ones are pruned
_DELETE_BATCH = 1000  # keys per DeleteObjects request (the S3 maximum)


class S3Tier(Tier):
    """Blocks as objects in ``bucket`` under ``prefix``; options are the fields of
    :class:`~kvstore.tiers.s3_client.S3Settings` (``endpoint`` is accepted for
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
        self.client = make_client(s)
        # The probe asks once and reports; botocore retries would only delay recovery.
        self.probe_client = make_client(s, max_attempts=1)
        self._reads = ThreadPoolExecutor(s.max_workers, thread_name_prefix="kvstore-s3-read")
        self._writes = ThreadPoolExecutor(s.max_workers, thread_name_prefix="kvstore-s3-write")
        self._transfer = _transfer_config(s.multipart_threshold)
        self._lock = threading.Lock()
        self._known: dict[BlockKey, BlockMeta] = {}
        self._used = 0
        self._negative: dict[BlockKey, float] = {}  # key -> monotonic expiry of "not in S3"
        self._counts = dict.fromkeys(
            ("gets", "hits", "discovered", "negative_hits", "over_capacity"), 0
        )
        self._closed = False
        self._background_tasks = 0  # deletes queued or running on the write pool
        self._background_idle = threading.Condition(self._lock)
        self.state = S3Health()
        self._queue = WriteBack(
            self._writes,
            self._upload,
            self._report,
            self._on_drop,
            self._on_orphan,
            max_bytes=s.queue_bytes,
            retries=s.demote_retries,
            backoff_s=s.retry_backoff_s,
            backoff_max_s=s.retry_backoff_max_s,
        )
        self.probe()
        self._prober = Prober(self.state, self.probe, s.probe_interval_s)

    # -- accounting -----------------------------------------------------------------------
    def used_bytes(self) -> int:
        return self._used

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
            if self._used - replaced + sum(len(d) for _, d, _ in copies) > self.capacity_bytes:
                raise CapacityError(
                    f"s3 tier: {len(copies)} blocks do not fit ({self._used} of "
                    f"{self.capacity_bytes} bytes used)"
                )
            self._queue.submit(copies)  # raises when full: then nothing below happens
            for key, _, meta in copies:
                self._remember(key, meta)
                self._negative.pop(key, None)

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
                self._forget(key)
        self._queue.cancel(keys)
        if keys:
            self._background(self._delete_objects, list(keys))

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
        if not prefix:
            return self._discover(keys)
        out: list[BlockMeta | None] = [None] * len(keys)
        window = 2 * self.settings.max_workers
        for start in range(0, len(keys), window):
            metas = self._discover(keys[start : start + window])
            out[start : start + len(metas)] = metas
            if any(m is None for m in metas):
                break
        return out

    def _discover(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        out: list[BlockMeta | None] = [None] * len(keys)
        ask: list[int] = []
        now = time.monotonic()
        negative_hits = 0
        for i, key in enumerate(keys):
            p = self._queue.get(key)
            meta = p.meta if p is not None else self._known.get(key)
            if meta is not None:
                out[i] = meta
            elif self._negative.get(key, 0.0) > now:
                negative_hits += 1
            else:
                ask.append(i)
        if ask and not self.state.degraded:
            if len(ask) == 1:
                answers = [self._head(keys[ask[0]])]
            else:
                answers = list(self._reads.map(self._head, [keys[i] for i in ask]))
            expiry = time.monotonic() + self.settings.negative_ttl_s
            with self._lock:
                for i, (meta, definitive) in zip(ask, answers, strict=True):
                    key = keys[i]
                    if meta is not None:
                        if key not in self._known:
                            if self._used + meta.size > self.capacity_bytes:
                                self._counts["over_capacity"] += 1
                                continue
                            self._remember(key, meta)
                            self._counts["discovered"] += 1
                        out[i] = meta
                    elif definitive:
                        self._negative[key] = expiry
                self._prune_negative(now)
        with self._lock:
            self._counts["negative_hits"] += negative_hits
        return out

    def scan(self) -> Iterator[tuple[BlockKey, BlockMeta]]:
        """Every block under the prefix: a paginated listing, each page HEADed in parallel
        for the metadata the listing lacks. Stops (with the error in ``health``) if S3 fails
        mid-way; blocks not scanned are still found later by :meth:`discover`."""
        if not self.settings.scan_on_start or self.state.degraded:
            return
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.settings.bucket, Prefix=self.settings.key_prefix
        )
        try:
            for page in pages:
                keys = [
                    k
                    for obj in page.get("Contents", ())
                    if (k := parse_key(self.settings.key_prefix, obj["Key"])) is not None
                ]
                for key, (meta, _) in zip(keys, self._reads.map(self._head, keys), strict=True):
                    if meta is None:
                        continue
                    with self._lock:
                        self._remember(key, meta)
                    yield key, meta
        except Exception as exc:  # listing failed: report, keep what we have
            self._report(exc)

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
            counts = dict(self._counts)
            counts.update(blocks=len(self._known), used_bytes=self._used)
        return {**self.health(), **counts}

    def probe(self) -> bool:
        """Ask S3 once whether the bucket serves (a one-key listing: unlike HEAD it carries
        an error code, so bad credentials are named). Creates the bucket if configured."""
        s = self.settings
        try:
            self.probe_client.list_objects_v2(Bucket=s.bucket, Prefix=s.key_prefix, MaxKeys=1)
        except Exception as exc:
            if not (s.create_bucket and classify(exc) == NO_BUCKET and self._create_bucket()):
                self._report(exc)
                return False
        self.state.ok()
        return True

    def flush(self) -> None:
        """Wait (up to ``flush_timeout_s`` in all) until the write-back queue is empty and
        background deletes are done."""
        deadline = time.monotonic() + self.settings.flush_timeout_s
        drained = self._queue.wait_idle(self.settings.flush_timeout_s)
        with self._background_idle:
            drained = (
                self._background_idle.wait_for(
                    lambda: not self._background_tasks, max(0.0, deadline - time.monotonic())
                )
                and drained
            )
        if not drained:
            log.warning("s3 tier flush timed out with %s", self._queue.stats())

    def close(self) -> None:
        """Drain the queue (bounded by ``flush_timeout_s``), then stop. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._queue.abandon()  # anything still failing drops now instead of backing off
        self._prober.close()
        self._writes.shutdown(wait=True)
        self._reads.shutdown(wait=True)
        self.client.close()
        self.probe_client.close()

    # -- S3 calls (pool threads) ----------------------------------------------------------
    def _upload(self, key: BlockKey, data: bytes, meta: BlockMeta) -> None:
        s = self.settings
        name = object_key(s.key_prefix, key)
        if len(data) >= s.multipart_threshold:
            self.client.upload_fileobj(
                io.BytesIO(data),
                s.bucket,
                name,
                ExtraArgs={"Metadata": meta_headers(meta)},
                Config=self._transfer,
            )
        else:
            self.client.put_object(
                Bucket=s.bucket, Key=name, Body=data, Metadata=meta_headers(meta)
            )
        self.state.ok()

    def _get_one(self, key: BlockKey) -> bytes | None:
        s = self.settings
        try:
            resp = self.client.get_object(Bucket=s.bucket, Key=object_key(s.key_prefix, key))
            body: bytes = resp["Body"].read()
        except Exception as exc:
            if self._report(exc) == MISSING:
                with self._lock:  # gone (evicted by another node): stop claiming it
                    if self._queue.get(key) is None:
                        self._forget(key)
            return None
        self.state.ok()
        meta = parse_meta(resp.get("Metadata", {}), len(body))
        if meta is None or checksum(body) != meta.checksum:
            self.state.count("corrupt")
            log.warning("s3 object %s failed its checksum; treated as a miss", key[1].hex())
            return None
        return body

    def _head(self, key: BlockKey) -> tuple[BlockMeta | None, bool]:
        """(meta, definitive): meta None with definitive True means S3 says "not there"."""
        s = self.settings
        try:
            resp = self.client.head_object(Bucket=s.bucket, Key=object_key(s.key_prefix, key))
        except Exception as exc:
            return None, self._report(exc) == MISSING
        self.state.ok()
        return parse_meta(resp.get("Metadata", {}), int(resp.get("ContentLength", -1))), True

    def _delete_objects(self, keys: list[BlockKey]) -> None:
        s = self.settings
        with self._lock:  # a key put again since its delete was scheduled must survive
            names = [object_key(s.key_prefix, k) for k in keys if not self.contains(k)]
        for start in range(0, len(names), _DELETE_BATCH):
            chunk = names[start : start + _DELETE_BATCH]
            try:
                self.client.delete_objects(
                    Bucket=s.bucket,
                    Delete={"Objects": [{"Key": n} for n in chunk], "Quiet": True},
                )
            except Exception as exc:
                self._report(exc)
                return
            self.state.ok()

    def _create_bucket(self) -> bool:
        s = self.settings
        kwargs: dict[str, Any] = {"Bucket": s.bucket}
        if s.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": s.region}
        try:
            self.probe_client.create_bucket(**kwargs)
        except Exception as exc:
            self._report(exc)
            return False
        return True

    # -- bookkeeping ----------------------------------------------------------------------
    def _report(self, exc: BaseException) -> str:
        kind = classify(exc)
        if kind != MISSING:
            self.state.fail(kind, describe(kind, exc, self.settings))
        return kind

    def _on_drop(self, key: BlockKey) -> None:
        self.state.count("dropped")
        with self._lock:
            if self._queue.get(key) is None:  # not put again meanwhile
                self._forget(key)

    def _on_orphan(self, key: BlockKey) -> None:
        self._background(self._delete_objects, [key])

    def _background(self, fn: Callable[[list[BlockKey]], None], keys: list[BlockKey]) -> None:
        """Run ``fn(keys)`` on the write pool, counted so that ``flush`` can wait for it.
        After close (pool shut down) skip it: the objects stay as orphans, which are still
        valid blocks. Caller must not hold ``_lock``."""
        if self._closed:
            return
        with self._lock:
            self._background_tasks += 1
        try:
            self._writes.submit(self._run_background, fn, keys)
        except RuntimeError:  # close() shut the pool down meanwhile
            self._background_done()

    def _run_background(self, fn: Callable[[list[BlockKey]], None], keys: list[BlockKey]) -> None:
        try:
            fn(keys)
        finally:
            self._background_done()

    def _background_done(self) -> None:
        with self._lock:
            self._background_tasks -= 1
            if not self._background_tasks:
                self._background_idle.notify_all()

    def _remember(self, key: BlockKey, meta: BlockMeta) -> None:
        """Caller holds ``_lock``."""
        old = self._known.get(key)
        self._used += meta.size - (old.size if old is not None else 0)
        self._known[key] = meta

    def _forget(self, key: BlockKey) -> None:
        """Caller holds ``_lock``."""
        old = self._known.pop(key, None)
        if old is not None:
            self._used -= old.size

    def _prune_negative(self, now: float) -> None:
        """Caller holds ``_lock``."""
        if len(self._negative) > _NEGATIVE_CACHE_MAX:
            self._negative = {k: t for k, t in self._negative.items() if t > now}


def _transfer_config(threshold: int) -> Any:
    from boto3.s3.transfer import TransferConfig

    # Parts of at least 5 MiB (the S3 minimum); a few in flight per object, since the pool
    # already runs many objects at once.
    return TransferConfig(
        multipart_threshold=threshold,
        multipart_chunksize=max(5 << 20, min(threshold, 8 << 20)),
        max_concurrency=4,
    )
