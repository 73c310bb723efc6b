"""The S3 tier's write side: puts cut into objects and queued for upload, the pointers of each
group's other members, deletes of the objects whose last live member died, and compaction.

Compaction: a deleted block's bytes stay in its group object while a live member shares it, so
a node's footprint in the bucket could grow to ``group_blocks`` times what it holds. When the
dead members of an object take more than ``compact_dead_share`` of its bytes, its live members
are read back (one ranged GET, each verified), written as new objects through the write-back
queue as a put would write them (served from the queue meanwhile), and once those are in S3
the old object and the dead members' pointers are deleted (so a crash between the two leaves
both, never neither). Another node reading the old object while it is replaced
sees a miss, as when a group is replaced by another node; never other bytes.

It owns the write pool's work: the write-back queue (``writeback``), the background tasks
(``background``), the alias names and the upload count. It shares with the rest of the tier
the node's :class:`~kvstore.tiers.s3.holdings.Holdings` and the one lock that guards them and
the :class:`~kvstore.tiers.s3.known.KnownBlocks`; it takes that lock, never holds it across an
S3 request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from kvstore.errors import CapacityError, TierUnavailableError
from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.tiers.s3.background import BackgroundTasks
from kvstore.tiers.s3.catalog_counts import CatalogLock
from kvstore.tiers.s3.client import S3Settings
from kvstore.tiers.s3.grouping import cut
from kvstore.tiers.s3.health import S3Health
from kvstore.tiers.s3.holdings import Holdings
from kvstore.tiers.s3.known import KnownBlocks
from kvstore.tiers.s3.layout import Where
from kvstore.tiers.s3.objects import Batch, S3Objects
from kvstore.tiers.s3.writeback import RETRYABLE, Pending, QueueStats, WriteBack
from kvstore.types import BlockKey


class S3Writer:
    """Puts, pointers and deletes of one S3 tier; ``capacity_bytes`` bounds what the node's
    holdings may charge. Every method is safe from any thread."""

    def __init__(
        self,
        settings: S3Settings,
        state: S3Health,
        objects: S3Objects,
        pool: ThreadPoolExecutor,
        held: Holdings,
        known: KnownBlocks,
        lock: CatalogLock,
        capacity_bytes: int,
    ) -> None:
        s = self.settings = settings
        self.state = state
        self.capacity_bytes = capacity_bytes
        self.closed = False
        self.uploaded = 0  # blocks uploaded (the queue counts objects)
        self._objects = objects
        self._held = held
        self._known = known
        self._lock = lock
        self._aliases = 0  # alias names handed out (see _name)
        self.compactions = 0  # group objects rewritten without their dead members
        self._background = BackgroundTasks(pool)  # deletes, pointers: flush waits
        self._queue = WriteBack(
            pool,
            self._upload,
            objects.report,
            self._on_drop,
            self._on_orphan,
            max_bytes=s.queue_bytes,
            retries=s.demote_retries,
            backoff_s=s.retry_backoff_s,
            backoff_max_s=s.retry_backoff_max_s,
        )

    def queued(self, name: BlockKey) -> Pending | None:
        """The object ``name`` while it waits in the write-back queue, else None."""
        return self._queue.get(name)

    def put_many(self, items: Sequence[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        """See :meth:`~kvstore.tiers.s3.tier.S3Tier.put_many`."""
        if self.closed:
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
            touched = {g for k, _, _ in fresh if (g := held.group_of(k)) is not None}
            for name, _, batch in batches:
                for index, (key, meta) in enumerate(zip(batch.keys, batch.metas, strict=True)):
                    dead += held.hold(key, meta, Where(name, index))
                    self._known.clear_negative(key)
            sparse = self._sparse(touched)
        if dead:
            self._background.submit(self._delete_objects, dead)
        for group in sparse:
            self._background.submit(self._compact, group)

    def delete(self, keys: Sequence[BlockKey]) -> None:
        """See :meth:`~kvstore.tiers.s3.tier.S3Tier.delete`."""
        with self._lock:
            touched = {g for k in keys if (g := self._held.group_of(k)) is not None}
            names = [n for key in keys for n in self._held.forget(key)]
            names = [n for n in names if not self._held.in_use(n)]
            sparse = self._sparse(touched)
        if names:
            self._queue.cancel(names)
            self._background.submit(self._delete_objects, names)
        for group in sparse:
            self._background.submit(self._compact, group)

    def stats(self) -> QueueStats:
        """The write-back queue's counters."""
        return self._queue.stats()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` in all until the queue is empty and background deletes and
        pointers are done; False if they were not."""
        deadline = time.monotonic() + timeout_s
        while True:  # a background task (compaction) may queue an upload: until both rest
            if not self._queue.wait_idle(max(0.0, deadline - time.monotonic())):
                return False
            if not self._background.wait_idle(max(0.0, deadline - time.monotonic())):
                return False
            if self._queue.wait_idle(0):
                return True

    def close(self) -> None:
        """Refuse new puts and stop retrying: what still fails drops now."""
        self.closed = True
        self._background.close()
        self._queue.abandon()  # anything still failing drops now instead of backing off

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

    def _sparse(self, groups: set[BlockKey]) -> list[BlockKey]:
        """Those of ``groups`` (still held, uploaded) that compaction should rewrite. Caller
        holds the lock."""
        bound = self.settings.compact_dead_share
        return [g for g in groups if self._held.dead_share(g) > bound
                and self._queue.get(g) is None]

    # -- S3 calls (pool threads) ----------------------------------------------------------
    def _compact(self, group: BlockKey) -> None:
        """Rewrite object ``group`` without its dead members (see the module docstring)."""
        with self._lock:
            if self.closed or not self._sparse({group}):
                return
            live = self._held.live_members(group)
        datas, _ = self._objects.read(group, [(pos, key) for pos, key, _ in live],
                                      live[0][2].size)
        with self._lock:
            if self.closed:
                return
            held = self._held
            # members deleted, moved or put again while we read keep what they have now
            kept = [(pos, key, meta, data) for (pos, key, meta), data
                    in zip(live, datas, strict=True)
                    if data is not None and held.find(key) == (meta, Where(group, pos))]
            if not kept:
                return
            dead = [n for _, key, _, _ in kept for n in held.forget(key)]
            batches = [(self._name(first), body, batch) for first, body, batch
                       in self._objects_of([(key, data, meta) for _, key, meta, data in kept])]
            try:
                self._queue.submit(batches)
            except TierUnavailableError:  # queue full: keep the old object, try another time
                for pos, key, meta, _ in kept:
                    held.hold(key, meta, Where(group, pos))
                return
            for name, _, batch in batches:
                for index, (key, meta) in enumerate(zip(batch.keys, batch.metas, strict=True)):
                    held.hold(key, meta, Where(name, index))
            self.compactions += 1
            dead = [n for n in dead if not held.in_use(n)]
        if dead:  # the old objects go once the new ones are in S3: never neither
            self._background.submit(self._delete_after, ([name for name, _, _ in batches], dead))

    def _delete_after(self, job: tuple[list[BlockKey], list[BlockKey]]) -> None:
        """Delete the objects ``job[1]`` once the uploads of ``job[0]`` have left the queue
        (landed, or dropped after their retries)."""
        uploads, names = job
        while not self.closed and any(self._queue.get(n) is not None for n in uploads):
            time.sleep(0.02)
        self._delete_objects(names)

    def _upload(self, name: BlockKey, data: bytes, batch: Batch) -> None:
        """Write a group object, then (in the background, counted by ``flush``) a pointer
        for each other member, so a pointer never names an object that is not there yet."""
        self._objects.put(name, data, batch)
        with self._lock:
            self.uploaded += len(batch.keys)
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
            if kind not in RETRYABLE or self.closed or attempt == s.demote_retries:
                return
            time.sleep(min(s.retry_backoff_max_s, s.retry_backoff_s * 2**attempt))

    def _delete_objects(self, names: list[BlockKey]) -> None:
        with self._lock:  # an object put again since its delete was scheduled must survive
            gone = [n for n in names if not self._held.in_use(n) and self._queue.get(n) is None]
        self._objects.delete(gone)

    # -- the queue's callbacks ------------------------------------------------------------
    def _on_drop(self, name: BlockKey) -> None:
        with self._lock:
            lost = [] if self._queue.get(name) is not None else self._held.lose(name)
        self.state.count("dropped", max(1, len(lost)))  # blocks given up, not objects

    def _on_orphan(self, name: BlockKey) -> None:
        self._background.submit(self._delete_objects, [name])
