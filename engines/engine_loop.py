"""The engine's own thread: it runs ``engine.step()`` over and over, admitting new requests
and aborting cancelled ones between steps, and hands each request's tokens to the asyncio loop
that waits for them (:class:`Pending`).

Request handlers (:mod:`engines.worker`) never call the engine directly: they submit to
:class:`EngineLoop` and read tokens from their :class:`Pending`; readers between steps (stats,
residency events) take :attr:`EngineLoop.lock`.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.decoder.scheduler import Sequence
from engines.worker_metrics import WorkerMetrics

UNHEALTHY_AFTER = 3  # engine-wide step failures in a row that make the worker unhealthy


@dataclass(slots=True)
class Pending:
    """A request in flight: the engine thread pushes ``(token, seq)`` and then ``None``."""

    loop: asyncio.AbstractEventLoop
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    seq: Sequence | None = None
    error: str | None = None
    last_token_at: float | None = None  # when the engine produced its latest token
    submitted_at: float = field(default_factory=time.perf_counter)  # handed to the thread

    def push(self, item: int | None) -> None:
        self.loop.call_soon_threadsafe(self.tokens.put_nowait, item)


# a request: its prompt, sampling and cache salt, and where its tokens go
Submission = tuple[list[int], SamplingParams, Pending, str | None]


class EngineLoop:
    """Runs ``engine.step()`` in a dedicated thread. ``lock`` guards the engine for readers
    (stats, residency events) between steps."""

    def __init__(self, engine: Engine, metrics: WorkerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.lock = threading.Lock()
        # a new request, a Pending to abort, or None to stop; one queue keeps them in order
        self.inbox: queue.Queue[Submission | Pending | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.pending: dict[Sequence, Pending] = {}
        self.failed_steps = 0  # engine-wide step failures in a row (no request to blame)

    @property
    def healthy(self) -> bool:
        """The engine thread runs and its steps are not all failing. A request the engine
        failed on its own never makes the worker unhealthy: a router would take every
        request away from it for one bad request."""
        return self.thread.is_alive() and self.failed_steps < UNHEALTHY_AFTER

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.inbox.put(None)
        self.thread.join(timeout=30)

    def submit(self, prompt: list[int], params: SamplingParams,
               cache_salt: str | None = None) -> Pending:
        p = Pending(asyncio.get_running_loop())
        self.inbox.put((prompt, params, p, cache_salt))
        return p

    def cancel(self, p: Pending) -> None:
        """Abort ``p``'s request before its next step (nothing if it has finished)."""
        self.inbox.put(p)

    def _run(self) -> None:
        while True:
            block = not self.engine.has_work()  # idle: sleep until a request arrives
            try:
                while True:
                    item = self.inbox.get(block=block)
                    if item is None:
                        return
                    if isinstance(item, Pending):
                        self._abort(item)
                    else:
                        self._admit(*item)
                    block = False
            except queue.Empty:
                pass
            with self.lock:
                try:
                    stepped = self.engine.step()
                except Exception as exc:  # not one request's: fail all in flight, go on
                    self.failed_steps += 1
                    self._fail_all(repr(exc))
                    continue
            self.failed_steps = 0
            for seq in stepped:
                p = self.pending[seq]
                if seq.error is not None:  # the engine failed this request alone
                    p.error = seq.error
                    p.push(None)
                    del self.pending[seq]
                    continue
                if self.metrics is not None:
                    p.last_token_at = self.metrics.token(seq, p.last_token_at)
                p.push(seq.tokens[-1])
                if seq.finished:
                    p.push(None)
                    del self.pending[seq]

    def _admit(self, prompt: list[int], params: SamplingParams, p: Pending,
               cache_salt: str | None) -> None:
        try:
            with self.lock:
                p.seq = self.engine.add_request(prompt, params, cache_salt=cache_salt)
        # refused (ValueError) or not, the failure is this request's alone: never the engine
        # thread's, which every other request needs
        except Exception as exc:
            p.error = str(exc)
            p.push(None)
            return
        self.pending[p.seq] = p

    def _abort(self, p: Pending) -> None:
        if p.seq is None or self.pending.pop(p.seq, None) is None:
            return  # refused at admission, or already finished
        with self.lock:
            self.engine.scheduler.abort(p.seq)

    def _fail_all(self, why: str) -> None:
        for seq, p in list(self.pending.items()):
            self.engine.scheduler.abort(seq)
            p.error = why
            p.push(None)
        self.pending.clear()
