"""The worker's face to the SLO planner: its role, switchable at run time (``POST
/admin/role``), and its recent latencies (``GET /latency``).

A role decides which routes take *new* requests (``prefill``: ``/prefill`` only; ``decode``:
``/generate`` only; ``both``: either). A switch changes only that gate: requests already
admitted run to their end in the engine as they were, so a switch drops nothing in flight and
needs no restart. A request refused for its role is answered 409 with the ``x-kvstore-role``
header (the worker's role now), which tells a router to learn the new role and try another
worker rather than fail the request.

``POST /admin/role`` is the worker's one admin route. It needs the worker's token
(``kvstore-engine serve --token-file``, see :mod:`engines.access`): without a token
configured it answers 403, so that no local process can move a worker between pools.

``GET /latency?since=N`` lists the requests finished after cursor ``N`` (time to first token,
inter-token latency, kind) and the worker's queue now: the planner keeps its own sliding
window over them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from fastapi import FastAPI, Header, HTTPException

from engines.access import Access
from engines.messages import FinishedRow, LatencyReport, RoleReply, RoleRequest

ROLES = ("both", "prefill", "decode")
ROLE_HEADER = "x-kvstore-role"
LATENCY_KEEP = 4096  # finished requests remembered for /latency



class Finished(NamedTuple):
    """One finished request as the planner sees it."""

    seq: int  # cursor
    at: float  # time.time() at the end
    kind: str  # "prefill" or "generate"
    ttft_s: float
    itl_s: float | None  # mean gap between output tokens; None with one token
    tokens: int


class WorkerControl:
    """The worker's current role and its log of finished requests. The role is read by
    request handlers on the event loop and written by the admin route on the same loop;
    the log is appended to from handlers too, so a plain lock is enough."""

    def __init__(self, role: str, *, can_prefill: bool, access: Access | None = None) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.role = role
        self.can_prefill = can_prefill
        self.access = access or Access(None)
        self.switches = 0
        self._log: deque[Finished] = deque(maxlen=LATENCY_KEEP)
        self._cursor = 0
        self._lock = threading.Lock()

    def refuse(self, route: str) -> None:
        """Raise the 409 for a new request on ``route`` that the current role does not take."""
        if route == "prefill" and self.role == "decode":
            raise HTTPException(409, "this worker only decodes",
                                headers={ROLE_HEADER: self.role})
        if route == "generate" and self.role == "prefill":
            raise HTTPException(409, "this worker only prefills; send /generate to a decoder",
                                headers={ROLE_HEADER: self.role})

    def switch(self, role: str) -> RoleReply:
        if role not in ROLES:
            raise HTTPException(400, f"role must be one of {', '.join(ROLES)}; got {role!r}")
        if role == "prefill" and not self.can_prefill:
            raise HTTPException(409, "role prefill needs --kvstore: its blocks go to the store")
        old, self.role = self.role, role
        self.switches += old != role
        return RoleReply(role=role, previous=old, switches=self.switches)

    def record(self, kind: str, ttft_s: float | None, first_at: float | None,
               tokens: int) -> None:
        """Log a finished request; ``first_at`` is the perf-counter time of its first token."""
        if ttft_s is None:
            return
        itl = None
        if first_at is not None and tokens > 1:
            itl = (time.perf_counter() - first_at) / (tokens - 1)
        with self._lock:
            self._cursor += 1
            self._log.append(Finished(self._cursor, time.time(), kind, ttft_s, itl, tokens))

    def since(self, cursor: int, inflight: int, waiting: int) -> LatencyReport:
        """The requests finished after ``cursor``, with the load given."""
        with self._lock:
            rows = [FinishedRow(**f._asdict()) for f in self._log if f.seq > cursor]
            return LatencyReport(cursor=self._cursor, role=self.role, finished=rows,
                                 inflight=inflight, waiting=waiting)

def install(app: FastAPI, control: WorkerControl,
            load: Callable[[], tuple[int, int]] = lambda: (0, 0)) -> None:
    """Add ``POST /admin/role`` and ``GET /latency`` to the worker's app; ``load`` gives the
    requests in flight and waiting that ``/latency`` adds (read without the engine's lock: a
    planner polls often)."""

    @app.post("/admin/role")
    async def set_role(req: RoleRequest,
                       authorization: str | None = Header(None)) -> RoleReply:
        """Switch the role for new requests; requests in flight finish under the old one."""
        control.access.check_admin(authorization)
        return control.switch(req.role)

    @app.get("/latency")
    async def latency(since: int = 0) -> LatencyReport:
        """Requests finished after cursor ``since`` (``ttft_s``, ``itl_s``, ``kind``) and the
        load now (``inflight``, ``waiting``)."""
        return control.since(since, *load())
