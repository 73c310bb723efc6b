"""The S3 tier's background tasks (deletes, group pointers): eviction and orphan cleanup never
wait for S3, yet ``flush`` can wait for them.

Each task runs on the tier's write pool and is counted while queued or running, so that
``wait_idle`` returns once none is left. After ``close`` new tasks are skipped: the objects
they would have deleted stay as orphans, which are still valid blocks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any


class BackgroundTasks:
    """Counted ``fn(arg)`` tasks on ``executor``. Thread-safe; never blocks a caller on
    the task itself."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._idle = threading.Condition()
        self._count = 0  # tasks queued or running
        self._closed = False

    def submit(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` on the executor, counted until it returns. Skipped after
        :meth:`close` or when the executor is already shut down."""
        if self._closed:
            return
        with self._idle:
            self._count += 1
        try:
            self._executor.submit(self._run, fn, arg)
        except RuntimeError:  # the executor was shut down meanwhile
            self._done()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no task is queued or running; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._count, timeout_s)

    def close(self) -> None:
        """Skip tasks submitted from now on. Call before shutting the executor down; tasks
        already queued still run."""
        self._closed = True

    def _run(self, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        finally:
            self._done()

    def _done(self) -> None:
        with self._idle:
            self._count -= 1
            if not self._count:
                self._idle.notify_all()
