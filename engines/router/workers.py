"""The router's view of its engine workers, and what keeps that view current.

A :class:`Worker` records one engine worker as the router sees it: whether it is up, the work
the router has running on it, and ``resident``, the block hashes it holds in its own paged
cache. ``resident`` is known from the worker's residency events (``/kv/events``): :func:`sync`
pulls them after every request and :func:`poll_forever` in the background; ``local_prefix``
turns them into the prefix (in blocks) of a prompt the worker would not recompute.

A worker is ``known`` once it has answered ``/info`` (its role and hash recipe); until then it
is never routed to, and the background poller asks again every ``POLL_S``, so that a router
started before its workers (or beside them, as the README does) serves as soon as one answers.
A worker that refuses a connection or answers 5xx is marked down (:meth:`Worker.mark_down`)
and skipped for ``RETRY_S``; the background poller brings it back when ``/health`` answers
again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import httpx
from pydantic import ValidationError

from engines.messages import KVEvents

log = logging.getLogger(__name__)

RETRY_S = 5.0  # seconds a failed worker is skipped before it is tried again
POLL_S = 1.0  # seconds between background health and residency polls


class Job:
    """What one request adds to a worker's load until it ends (see :meth:`Worker.begin`)."""

    __slots__ = ("hashes", "prefill", "tokens")

    def __init__(self, tokens: int, prefill: int, hashes: list[bytes]) -> None:
        self.tokens = tokens  # prompt + max_tokens: the naive size, for least-loaded
        self.prefill = max(1, prefill)  # estimated prompt tokens to compute; 0 once decoding
        self.hashes = hashes  # the prompt's blocks, resident here once it has run


@dataclass(slots=True, eq=False)
class Worker:
    """One engine worker as the router sees it; mutated only on the router's asyncio loop."""

    url: str
    role: str = "both"
    known: bool = False  # answered /info: its role and hash recipe are known
    up: bool = True
    down_until: float = 0.0
    inflight: int = 0
    queued: int = 0  # prompt + max_tokens of the requests the router has running here
    pending_prefill: int = 0  # estimated prompt tokens to compute before their first tokens
    decoding: int = 0  # requests running here past their first token
    cursor: int = 0
    resident: set[bytes] = field(default_factory=set)
    # blocks of requests sent here and not finished: resident soon, before their events come
    promised: dict[bytes, int] = field(default_factory=dict)
    rates: Mapping[str, float | None] = field(default_factory=dict)  # /info, /kv/events
    routed: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0  # prefix tokens the worker reported it did not compute
    node: str | None = None  # the cluster node id of its kvstore (/info), if in a cluster

    def available(self, now: float) -> bool:
        return self.up or now >= self.down_until

    def local_prefix(self, hashes: list[bytes]) -> int:
        """Leading blocks of ``hashes`` resident here, or about to be (a request routed here
        that has not finished computes them)."""
        n = 0
        for h in hashes:
            if h not in self.resident and h not in self.promised:
                break
            n += 1
        return n

    def begin(self, job: Job) -> None:
        """Count ``job`` as running here until :meth:`end`."""
        self.inflight += 1
        self.queued += job.tokens
        self.pending_prefill += job.prefill
        for h in job.hashes:
            self.promised[h] = self.promised.get(h, 0) + 1

    def first_token(self, job: Job) -> None:
        """``job``'s prompt is computed: its prefill no longer waits here; it decodes."""
        if job.prefill:
            self.pending_prefill -= job.prefill
            self.decoding += 1
            job.prefill = 0

    def end(self, job: Job) -> None:
        self.first_token(job)
        self.inflight -= 1
        self.decoding -= 1
        self.queued -= job.tokens
        for h in job.hashes:
            left = self.promised[h] - 1
            if left:
                self.promised[h] = left
            else:
                del self.promised[h]

    def mark_unknown(self) -> None:
        """Not answering ``/info`` yet (still starting, or not there): never routed to until
        the poller hears from it."""
        self.known, self.up, self.down_until = False, False, math.inf

    def mark_known(self, role: str) -> None:
        self.known, self.role, self.up, self.down_until = True, role, True, 0.0

    def mark_down(self) -> None:
        """Count a failure and skip the worker for ``RETRY_S`` (the poller may revive it
        sooner)."""
        self.up, self.failures = False, self.failures + 1
        self.down_until = time.monotonic() + RETRY_S


def place(w: Worker, workers: list[Worker], prefill: list[Worker]) -> None:
    """Keep ``w`` in the pool its role serves: a worker switched at run time (``POST
    /admin/role``, the SLO planner) moves between the decode (``workers``) and ``prefill``
    lists; ``both`` stays where it was configured."""
    if w.role == "prefill" and w in workers:
        workers.remove(w)
        prefill.append(w)
    elif w.role == "decode" and w in prefill:
        prefill.remove(w)
        workers.append(w)


async def sync(client: httpx.AsyncClient, w: Worker) -> None:
    """Pull ``w``'s residency events since the last pull."""
    try:
        r = await client.get(f"{w.url}/kv/events", params={"since": w.cursor}, timeout=10.0)
        r.raise_for_status()
    except (httpx.HTTPError, ValueError):
        return
    try:
        doc = KVEvents.model_validate_json(r.content)
    except ValidationError:
        log.warning("worker %s: /kv/events is not a worker's answer", w.url)
        return
    w.rates = doc.rates or w.rates
    if doc.resync or doc.cursor < w.cursor:  # dropped events, or a restarted worker
        w.resident = {bytes.fromhex(h) for h in doc.resident}
    for e in doc.events:
        h = bytes.fromhex(e.hash)
        if e.stored:
            w.resident.add(h)
        else:
            w.resident.discard(h)
    w.cursor = doc.cursor


async def poll_forever(client: httpx.AsyncClient, workers: Callable[[], list[Worker]],
                       sync_one: Callable[[Worker], Awaitable[None]],
                       learn: Callable[[Worker], Awaitable[bool]]) -> None:
    """Every ``POLL_S``: ask workers for ``/info`` through ``learn`` (the ones not known yet,
    and the live ones, whose role may have been switched at run time), bring back down workers
    whose ``/health`` answers, and pull the residency events of every live decode-capable
    worker through ``sync_one``."""
    while True:
        await asyncio.sleep(POLL_S)
        for w in list(workers()):
            if not w.known or w.up:
                await learn(w)
            elif not w.up:
                try:
                    r = await client.get(f"{w.url}/health", timeout=2.0)
                    w.up = r.status_code == 200
                except httpx.HTTPError:
                    continue
            if w.up and w.role != "prefill":
                await sync_one(w)
