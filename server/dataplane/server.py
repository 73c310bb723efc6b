"""The data plane server: frames (see :mod:`kvstore.protocol.frame`) over TCP and a Unix socket.

:class:`DataPlane` owns both listeners, the worker pool, the connection set and the lease
reaper; each connection is a :class:`server.dataplane.conn.Connection` (framing, serving,
backpressure and timeouts live there). Connections that have not authenticated yet (pending)
are limited apart from established ones, so that half-open connections cannot take the slots
of real clients: past ``max_pending_connections`` the oldest pending one is closed (a real
client says hello at once; an idle one waits for its ``hello_timeout_s``), and
``max_connections`` counts established connections only, of which one tenant holds at most
``max_connections_per_tenant`` (the admin's are not counted). A refused connection gets a
``busy`` error frame saying which limit, then a close, and is counted in
``kvstore_dataplane_connections_refused_total{reason}``. A vanished client's pins go when
its last connection closes (its grants ``grant_grace_s`` later), and otherwise when their
leases run out (a reaper expires leases every second).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from kvstore.protocol.frame import FrameError
from kvstore.protocol.info import ServerInfo
from kvstore.store import StoreAPI
from server.dataplane.buffers import BufferPool
from server.dataplane.conn import Connection
from server.dataplane.ops import Ops
from server.dataplane.shm_ops import GRANT_SUFFIX, READ_SUFFIX
from server.metrics import ServerMetrics
from server.preflight import claim_socket_path
from server.settings import ServerSettings

if TYPE_CHECKING:
    from server.peer_fill import PeerFill

__all__ = ["Connection", "DataPlane"]

log = logging.getLogger("kvstore.dataplane")


class DataPlane:
    """Both listeners, the worker pool, the connection set and the lease reaper."""

    def __init__(self, store: StoreAPI, settings: ServerSettings, ops_info: ServerInfo,
                 auth: Any, metrics: ServerMetrics, durable_tier: str | None,
                 fill: PeerFill | None = None) -> None:
        from server.auth import ADMIN

        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.auth_on = auth.enabled
        self.admin = ADMIN
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kvstore-data")
        self.buffers = BufferPool(settings.recv_buffer_bytes)
        self.ops = Ops(store, settings, auth, ops_info, durable_tier, self._run, fill)
        self.ops.buffers = self.buffers
        self.connections: set[Connection] = set()
        self.pending: dict[Connection, None] = {}  # not authenticated yet, oldest first
        self.established = 0
        self.tenants: dict[Connection, str] = {}  # established connections of a tenant
        self.per_tenant: Counter[str] = Counter()
        self.inflight = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        metrics.watch_connections("tcp", lambda: self.open_connections(unix=False))
        metrics.watch_connections("unix", lambda: self.open_connections(unix=True))

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def start(self, tcp: list[socket.socket]) -> None:
        """Listen on the TCP sockets the runtime bound (``data_port``; none when it is 0) and
        on the Unix socket."""
        loop = asyncio.get_running_loop()
        s = self.settings
        for sock in tcp:
            self._servers.append(await loop.create_server(
                lambda: Connection(self), sock=sock, backlog=512))
        path = s.socket_path
        if path:
            claim_socket_path(path)  # a stale socket only; the runtime checked it already
            self._servers.append(await loop.create_unix_server(
                lambda: Connection(self), path, backlog=512))
            os.chmod(path, 0o600)
        self._reaper = asyncio.ensure_future(self._reap())

    def opened(self, conn: Connection) -> None:
        self.connections.add(conn)
        self.metrics.connections.inc()
        self.pending[conn] = None
        if len(self.pending) > self.settings.max_pending_connections:
            oldest = next((c for c in self.pending if c._stage != 3), conn)
            del self.pending[oldest]
            log.warning("data plane: %d connections waiting to authenticate; closing the oldest",
                        len(self.pending) + 1)
            self.metrics.refused.labels("max_pending_connections").inc()
            oldest._fail(FrameError("busy", "too many connections waiting to authenticate "
                                            "(max_pending_connections); say hello sooner"))

    def open_connections(self, *, unix: bool) -> int:
        """Connections open now over the Unix socket (``unix``) or TCP."""
        return sum(c.session.unix == unix for c in list(self.connections))

    def promote(self, conn: Connection) -> str | None:
        """Count ``conn`` as established; None if it is, else why not (a ``busy`` message):
        ``max_connections`` are already, or its tenant holds ``max_connections_per_tenant``."""
        self.pending.pop(conn, None)
        s = self.settings
        if self.established >= s.max_connections:
            log.warning("data plane: connection limit %d reached", s.max_connections)
            self.metrics.refused.labels("max_connections").inc()
            return f"too many connections (max_connections {s.max_connections}); try again later"
        tenant = conn.session.tenant
        if tenant is not None:
            cap = s.tenant_connections()
            if self.per_tenant[tenant] >= cap:
                log.warning("data plane: tenant %r holds its %d connections", tenant, cap)
                self.metrics.refused.labels("max_connections_per_tenant").inc()
                return (f"tenant {tenant!r} holds {cap} data plane connections "
                        "(max_connections_per_tenant); close one or try again later")
            self.per_tenant[tenant] += 1
            self.tenants[conn] = tenant
        conn.established = True
        self.established += 1
        return None

    def closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.pending.pop(conn, None)
        if conn.established:
            conn.established = False
            self.established -= 1
            tenant = self.tenants.pop(conn, None)
            if tenant is not None:  # counted under the tenant it had when established
                self.per_tenant[tenant] -= 1
                if not self.per_tenant[tenant]:
                    del self.per_tenant[tenant]
        owner = conn.session.owner
        if any(c.session.owner == owner for c in self.connections):
            return
        # the client's last connection: its pins and reservations go now, not at lease end
        self.background(self._drop_owner, owner)

    def background(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on a worker thread without waiting; errors are logged. Nothing
        runs once the plane is closing: closing the store frees every pin and reservation."""
        if self._closing:
            return

        async def run() -> None:
            try:
                await self._run(fn, *args)
            except Exception:  # while closing, the pool may already be shut: nothing to do
                log.log(logging.DEBUG if self._closing else logging.WARNING,
                        "background %s failed", getattr(fn, "__name__", fn), exc_info=True)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _drop_owner(self, owner: str) -> None:
        # The owner's grants (GRANT_SUFFIX) get grant_grace_s more at most, not nothing:
        # other processes (an engine's workers) may be copying them right now. After that
        # they go too, so grants cannot outlive their client by a whole lease.
        try:
            for who in (owner, owner + READ_SUFFIX):
                self.store.expire_leases(who)
            self.store.cut_leases(owner + GRANT_SUFFIX, self.settings.grant_grace_s)
        except Exception:  # the store may be closing; leases expire on their own anyway
            log.debug("dropping pins of %s failed", owner, exc_info=True)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self._run(self.store.expire_leases)
            except Exception:
                log.exception("expiring leases failed")

    async def close(self, grace_s: float) -> None:
        """Stop accepting, let in-flight requests finish, then close every connection once
        the replies already written to it are sent: all within ``grace_s``, after which what
        is left is cut off."""
        self._closing = True
        for server in self._servers:
            server.close()
        deadline = time.monotonic() + grace_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()  # flushes its buffer first, then connection_lost
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self._reaper is not None:
            self._reaper.cancel()
        self.executor.shutdown(wait=True)
        path = self.settings.socket_path
        if path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
