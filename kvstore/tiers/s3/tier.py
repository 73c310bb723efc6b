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
- **Groups.** ``put_many`` writes runs of up to ``group_blocks`` consecutive blocks as one
  object and a pointer for each other member; a batch read fetches each group's members with
  one ranged GET and verifies every block alone. A deleted block stays in its object until
  the last live member dies, then the object and its pointers are deleted (``holdings``).

The parts: S3 requests in ``objects``, the write-back queue in ``writeback``, what this node
holds and the deletion rule in ``holdings``, discovery and the negative cache in ``known``,
which blocks share an object in ``grouping``, background deletes and pointers in
``background``.
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
from kvstore.tiers.s3.grouping import cut
from kvstore.tiers.s3.health import Prober, S3Health
from kvstore.tiers.s3.holdings import Holdings
from kvstore.tiers.s3.known import KnownBlocks
from kvstore.tiers.s3.layout import Where
from kvstore.tiers.s3.objects import Batch, S3Objects
from kvstore.tiers.s3.writeback import RETRYABLE, WriteBack
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
        self._aliases = 0  # alias names handed out (see _name)
        self._uploaded = 0  # blocks uploaded (the queue counts objects)
        self._background = BackgroundTasks(self._writes)  # deletes, pointers: flush waits
        self._queue = WriteBack(
            self._writes,
            self._upload,
            self._objects.report,
            self._on_drop,
            self._on_orphan,
            max_bytes=s.queue_bytes,
            retries=s.demote_retries,
            backoff_s=s.retry_backoff_s,
            backoff_max_s=s.retry_backoff_max_s,
        )
        self._held = Holdings()
        self._known = KnownBlocks(
            self._objects, self._reads, self._held, capacity_bytes, self._lock
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
        if self._closed:
            raise TierUnavailableError("s3 tier is closed")
        if self.state.auth_failed:
            raise TierUnavailableError(self.state.last_error)
        for key, buf, meta in items:
            if memoryview(buf).nbytes != meta.size:
                raise ValueError(
                    f"block {key[1].hex()} has {memoryview(buf).nbytes} bytes, "
                    f"meta says {meta.size}"
                )
        last = {key: i for i, (key, _, _) in enumerate(items)}  # a key twice: the last wins
        blocks = [it for i, it in enumerate(items) if last[it[0]] == i]
        # Objects are cut and copied out of the caller's buffers (one copy) before taking the
        # lock, assuming every block is new; the rare batch that holds known blocks is cut
        # again under the lock.
        batches = self._objects_of(blocks)
        with self._lock:
            held = self._held
            fresh = [b for b in blocks if held.get(b[0]) != b[2]]
            revive = [(k, m) for k, _, m in fresh if held.revivable(k, m) is not None]
            fresh = [b for b in fresh if held.revivable(b[0], b[2]) is None]
            replaced = sum(m.size for k, _, _ in fresh if (m := held.get(k)))
            need = sum(m.size for _, _, m in fresh) + sum(m.size for _, m in revive)
            if held.used - replaced + need > self.capacity_bytes:
                raise CapacityError(
                    f"s3 tier: {len(blocks)} blocks do not fit ({held.used} of "
                    f"{self.capacity_bytes} bytes used)"
                )
            if len(fresh) != len(blocks):
                batches = self._objects_of(fresh)
            batches = [(self._name(first), data, batch) for first, data, batch in batches]
            self._queue.submit(batches)  # raises when full: then nothing below happens
            for key, meta in revive:
                held.revive(key, meta)
            dead: list[BlockKey] = []
            for name, _, batch in batches:
                for index, (key, meta) in enumerate(zip(batch.keys, batch.metas, strict=True)):
                    dead += held.hold(key, meta, Where(name, index))
                    self._known.clear_negative(key)
        if dead:
            self._background.submit(self._delete_objects, dead)

    def _objects_of(
        self, blocks: Sequence[tuple[BlockKey, Buffer, BlockMeta]]
    ) -> list[tuple[BlockKey, bytes, Batch]]:
        """``blocks`` cut into objects (``grouping.cut``): first key, body, members."""
        s = self.settings
        return [
            (g[0][0], bytes(g[0][1]) if len(g) == 1 else b"".join(d for _, d, _ in g),
             Batch(tuple(k for k, _, _ in g), tuple(m for _, _, m in g)))
            for g in cut(blocks, s.group_blocks, s.group_bytes)
        ]

    def _name(self, first: BlockKey) -> BlockKey:
        """The name of a new object whose first block is ``first``: ``first`` itself, unless
        a group object of live blocks has that name (``first`` was its member 0 and is put
        again with other bytes); then an alias that discovery and scans skip, so that the
        live blocks keep their object. Caller holds the lock."""
        if not self._held.names_group(first):
            return first
        self._aliases += 1
        return first[0], first[1] + b"\x00" + self._aliases.to_bytes(8, "big")

    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        """Bytes of each known key: from the write-back queue while queued, else from S3,
        one ranged GET per group object for all the keys it holds (the groups in parallel,
        the caller waits once). None for unknown keys, missing or corrupt blocks, and
        everything not queued while S3 is degraded."""
        out: list[bytes | None] = [None] * len(keys)
        remote: dict[BlockKey, list[tuple[int, int, BlockKey]]] = {}
        sizes: dict[BlockKey, int] = {}  # group -> its block size
        for i, key in enumerate(keys):
            held = self._held.find(key)
            if held is None:
                continue
            (_, _, size), where = held
            p = self._queue.get(where.group)
            if p is not None and p.meta.keys[where.pos : where.pos + 1] == (key,):
                at = where.pos * size  # immutable bytes: sharing them is a copy
                out[i] = p.data if len(p.data) == size else p.data[at : at + size]
            else:
                remote.setdefault(where.group, []).append((i, where.pos, key))
                sizes[where.group] = size
        if remote and not self.state.degraded:
            reads = [(group, members, sizes[group]) for group, members in remote.items()]
            if len(reads) == 1:  # no thread hop for a single object
                results = [self._read_group(*reads[0])]
            else:
                results = list(self._reads.map(lambda r: self._read_group(*r), reads))
            for (_, members, _), datas in zip(reads, results, strict=True):
                for (i, _, _), data in zip(members, datas, strict=True):
                    out[i] = data
        with self._lock:
            self._counts["gets"] += len(keys)
            self._counts["hits"] += sum(b is not None for b in out)
        return out

    def contains(self, key: BlockKey) -> bool:
        """Whether this node knows the block (queued, written, scanned or discovered); no S3
        request. Use :meth:`discover` to ask S3 about blocks other nodes wrote."""
        return key in self._held

    def delete(self, keys: Sequence[BlockKey]) -> None:
        """Forget the keys now; a group object whose last live member this was is deleted
        (with its members' pointers) in the background, or its upload cancelled (eviction
        never waits for S3). A failed delete leaves an orphan object that is still a valid
        block."""
        with self._lock:
            names = [n for key in keys for n in self._held.forget(key)]
            names = [n for n in names if not self._held.in_use(n)]
        if names:
            self._queue.cancel(names)
            self._background.submit(self._delete_objects, names)

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
        queue = self._queue.stats()
        return {
            "ok": not snap["degraded"],
            "backend": "s3",
            "endpoint": self.settings.endpoint_url or "aws",
            "bucket": self.settings.bucket,
            "prefix": self.settings.key_prefix,
            **snap,
            **queue,
            "uploaded": self._uploaded,
            "uploaded_objects": queue["uploaded"],
        }

    def stats(self) -> dict[str, Any]:
        """Health plus traffic counters: ``gets``/``hits`` (blocks), ``discovered`` (blocks
        adopted from other nodes), ``negative_hits``, ``over_capacity`` (found but not adopted),
        ``blocks``, ``used_bytes``, ``objects`` (group objects with a live block) and
        ``dead_bytes`` (deleted blocks still stored beside live ones)."""
        with self._lock:
            counts = {**self._counts, **self._known.counts}
            counts.update(
                blocks=len(self._held),
                used_bytes=self._held.used,
                objects=self._held.objects,
                dead_bytes=self._held.dead_bytes,
            )
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
    def _upload(self, name: BlockKey, data: bytes, batch: Batch) -> None:
        """Write a group object, then (in the background, counted by ``flush``) a pointer
        for each other member, so a pointer never names an object that is not there yet."""
        self._objects.put(name, data, batch)
        with self._lock:
            self._uploaded += len(batch.keys)
        for index in range(1, len(batch.keys)):
            where = Where(name, index)
            pointer = (batch.keys[index], batch.metas[index], where)
            self._background.submit(self._put_pointer, pointer)

    def _put_pointer(self, pointer: tuple[BlockKey, BlockMeta, Where]) -> None:
        """Write one pointer, retrying transient failures as uploads do. One that still
        fails leaves the block readable by this node; other nodes miss it and recompute."""
        key, meta, where = pointer
        s = self.settings
        for attempt in range(s.demote_retries + 1):
            with self._lock:  # deleted or moved meanwhile, or the name holds live blocks
                if self._held.where(key) != where or self._held.names_group(key):
                    return
            kind = self._objects.put_pointer(key, meta, where)
            if kind not in RETRYABLE or self._closed or attempt == s.demote_retries:
                return
            time.sleep(min(s.retry_backoff_max_s, s.retry_backoff_s * 2**attempt))

    def _read_group(
        self, group: BlockKey, members: list[tuple[int, int, BlockKey]], size: int
    ) -> list[bytes | None]:
        wanted = [(index, key) for _, index, key in members]
        datas, gone = self._objects.read(group, wanted, size)
        if gone:
            with self._lock:  # gone (evicted or replaced by another node): stop claiming it
                if self._queue.get(group) is None:
                    for key in self._held.lose(group):
                        self._known.mark_missing(key)
        return datas

    def _delete_objects(self, names: list[BlockKey]) -> None:
        with self._lock:  # an object put again since its delete was scheduled must survive
            gone = [n for n in names if not self._held.in_use(n) and self._queue.get(n) is None]
        self._objects.delete(gone)

    # -- bookkeeping ----------------------------------------------------------------------
    def _on_drop(self, name: BlockKey) -> None:
        with self._lock:
            lost = [] if self._queue.get(name) is not None else self._held.lose(name)
        self.state.count("dropped", max(1, len(lost)))  # blocks given up, not objects

    def _on_orphan(self, name: BlockKey) -> None:
        self._background.submit(self._delete_objects, [name])
