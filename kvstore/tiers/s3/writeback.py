"""The S3 tier's bounded write-back queue: demotions return at once, uploads happen behind.

``submit`` takes objects (a group of blocks joined into one body, named after its first key;
see ``layout``), bounded in bytes, all-or-nothing, and schedules one upload task per object on
the write pool. While an object waits or uploads its blocks are served from the queue. A
failed upload is retried with exponential backoff when the failure is transient (throttling,
unreachable, 5xx) and dropped at once when retrying cannot help (credentials, missing
bucket); a dropped object is counted and reported through ``on_drop`` so the tier
forgets its blocks.

Ordering per key: each submit bumps a generation; an upload task whose generation is no longer
the queued one (overwritten or deleted meanwhile) does nothing, so at most the newest bytes
are uploaded. An upload that finishes after its key was deleted reports ``on_orphan`` so the
tier can delete the object it just created.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import NamedTuple

from kvstore.errors import TierUnavailableError
from kvstore.tiers.s3.client import THROTTLED, UNAVAILABLE
from kvstore.tiers.s3.objects import Batch
from kvstore.types import BlockKey

RETRYABLE = frozenset({THROTTLED, UNAVAILABLE})


class Pending(NamedTuple):
    data: bytes
    meta: Batch
    gen: int


class QueueStats(NamedTuple):
    """The write-back queue's counters: blocks and bytes waiting, the queue's bound in bytes,
    and blocks uploaded so far."""

    pending: int
    pending_bytes: int
    queue_bytes: int
    uploaded: int


class WriteBack:
    """Bounded write-back queue drained by ``executor``.

    ``upload(name, data, batch)`` writes one object and raises on failure; ``report(exc)``
    records a failure and returns its kind (``client.classify``).
    """

    def __init__(
        self,
        executor: Executor,
        upload: Callable[[BlockKey, bytes, Batch], None],
        report: Callable[[BaseException], str],
        on_drop: Callable[[BlockKey], None],
        on_orphan: Callable[[BlockKey], None],
        *,
        max_bytes: int,
        retries: int,
        backoff_s: float,
        backoff_max_s: float,
    ) -> None:
        self._executor = executor
        self._upload = upload
        self._report = report
        self._on_drop = on_drop
        self._on_orphan = on_orphan
        self.max_bytes = max_bytes
        self._retries = retries
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending: dict[BlockKey, Pending] = {}
        # one upload per key at a time, so that a newer version always lands last
        self._inflight: dict[BlockKey, threading.Event] = {}
        self._bytes = 0
        self._gen = 0
        self._abandon = threading.Event()  # set by close(): stop retrying, drop what is left
        self.uploaded = 0

    # -- producer side --------------------------------------------------------------------
    def submit(self, items: Sequence[tuple[BlockKey, bytes, Batch]]) -> None:
        """Queue every item (bytes already copied by the caller), or none of them: raises
        :class:`TierUnavailableError` when the queue cannot take the whole batch."""
        scheduled: list[tuple[BlockKey, int]] = []
        with self._lock:
            replaced = sum(len(p.data) for k, _, _ in items if (p := self._pending.get(k)))
            needed = sum(len(d) for _, d, _ in items)
            if self._bytes - replaced + needed > self.max_bytes:
                raise TierUnavailableError(
                    f"s3 write-back queue full ({self._bytes} of {self.max_bytes} bytes pending, "
                    f"{needed} more asked): S3 is slower than demotions; dropping instead"
                )
            for key, data, meta in items:
                old = self._pending.get(key)
                if old is not None:
                    self._bytes -= len(old.data)
                self._gen += 1
                self._pending[key] = Pending(data, meta, self._gen)
                self._bytes += len(data)
                scheduled.append((key, self._gen))
        # One task per object: objects of a batch upload in parallel, each retried on its own.
        for key, gen in scheduled:
            self._executor.submit(self._drain, key, gen)

    def get(self, key: BlockKey) -> Pending | None:
        """The queued object named ``key`` (waiting or uploading), if any."""
        return self._pending.get(key)

    def cancel(self, keys: Sequence[BlockKey]) -> None:
        """Forget queued objects (their blocks were deleted); their uploads will not start."""
        with self._lock:
            for key in keys:
                p = self._pending.pop(key, None)
                if p is not None:
                    self._bytes -= len(p.data)
            self._notify_if_idle()

    # -- consumer side --------------------------------------------------------------------
    def _drain(self, key: BlockKey, gen: int) -> None:
        attempt = 0
        while True:
            with self._lock:
                p = self._pending.get(key)
                if p is None or p.gen != gen:
                    return  # overwritten (a newer task uploads) or deleted
                busy = self._inflight.get(key)
                if busy is None:
                    self._inflight[key] = threading.Event()
            if busy is not None:  # an older version of this key is uploading: go after it
                busy.wait()
                continue
            try:
                try:
                    self._upload(key, p.data, p.meta)
                finally:
                    with self._lock:
                        self._inflight.pop(key).set()
            except Exception as exc:
                kind = self._report(exc)
                if kind in RETRYABLE and attempt < self._retries and not self._abandon.is_set():
                    delay = min(self._backoff_max_s, self._backoff_s * (2**attempt))
                    attempt += 1
                    self._abandon.wait(delay)
                    continue
                if self._finish(key, gen):
                    self._on_drop(key)
                return
            if self._finish(key, gen, uploaded=True) is None:
                self._on_orphan(key)
            return

    def _finish(self, key: BlockKey, gen: int, *, uploaded: bool = False) -> bool | None:
        """Remove the ``gen`` entry of ``key``. True if removed, False if a newer one is
        queued, None if the key was deleted meanwhile."""
        with self._lock:
            if uploaded:
                self.uploaded += 1
            p = self._pending.get(key)
            if p is None:
                return None
            if p.gen != gen:
                return False
            del self._pending[key]
            self._bytes -= len(p.data)
            self._notify_if_idle()
            return True

    def _notify_if_idle(self) -> None:
        if not self._pending:
            self._idle.notify_all()

    # -- lifecycle ------------------------------------------------------------------------
    def wait_idle(self, timeout_s: float) -> bool:
        """Block until nothing is queued; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout=timeout_s)

    def abandon(self) -> None:
        """Stop backing off: remaining failures drop at once (used by close)."""
        self._abandon.set()

    def stats(self) -> QueueStats:
        with self._lock:
            return QueueStats(len(self._pending), self._bytes, self.max_bytes, self.uploaded)
