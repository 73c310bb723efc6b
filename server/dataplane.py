"""The data plane server: frames (see :mod:`server.protocol`) over TCP and a Unix socket.

Each connection is an ``asyncio.BufferedProtocol`` that receives every frame piece straight
into its final buffer (the payload lands once, where the store reads it). A connection serves
one frame at a time: reading pauses while a request runs, so replies keep request order and a
client cannot queue unbounded work. Concurrency comes from many connections.

Faults: a frame that starts must complete within ``frame_timeout_s`` and a silent connection
is closed after ``idle_timeout_s`` (slowloris); a bad header gets an error frame and the
connection keeps serving; broken framing (oversized or empty header) gets an error frame and
a close. A vanished client's pins go when its last connection closes, and otherwise when
their leases run out (a reaper expires leases every second).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from server.buffers import BufferPool
from server.dataplane_ops import Ops, Session
from server.dataplane_shm import READ_SUFFIX
from server.direct_put import DirectPut
from server.direct_put import begin as begin_direct
from server.errors import map_error
from server.metrics import ServerMetrics
from server.protocol import (
    PREFIX_BYTES,
    Buffer,
    FrameError,
    decode_header,
    decode_prefix,
    encode_frame,
)
from server.settings import ServerSettings

log = logging.getLogger("kvstore.dataplane")


class Connection(asyncio.BufferedProtocol):
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.settings = plane.settings
        self.session = Session(principal=None if plane.auth_on else plane.admin)
        self.transport: asyncio.Transport | None = None
        self._prefix = bytearray(PREFIX_BYTES)
        self._header = bytearray()
        self._payload = bytearray()
        self._target: memoryview = memoryview(self._prefix)
        self._pos = 0
        self._stage = 0  # 0 prefix, 1 header, 2 payload
        self._lens = (0, 0)
        self._timer: asyncio.TimerHandle | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._task: asyncio.Task[None] | None = None
        self._close_after = False  # the frame broke the session (auth): close after replying
        self._direct: DirectPut | None = None  # a put read straight into the host tier
        self.closed = False

    # -- asyncio protocol -----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # big blocks: fewer, larger reads and writes
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        self.plane.opened(self)
        self._arm(self.settings.idle_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        direct = self._direct
        if direct is not None and self._stage == 2:  # the payload never completed
            self.plane.background(direct.abort)
        self._writable.set()
        self.plane.closed(self)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._target[self._pos:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._stage == 0 and self._pos == 0:  # first bytes of a frame: it must finish
            self._arm(self.settings.frame_timeout_s)
        self._pos += nbytes
        if self._pos < len(self._target):
            return
        if self._stage == 2 and self._direct is not None:
            place = self._direct.next_target()
            if place is not None:  # the next block's place in the slab
                self._target, self._pos = place, 0
                return
        try:
            self._advance()
        except FrameError as exc:  # broken framing: answer, then close
            self._fail(exc)

    def eof_received(self) -> bool:
        return False  # close; a half-open client gets no more replies

    # -- framing --------------------------------------------------------------------------
    def _advance(self) -> None:
        if self._stage == 0:
            self._lens = decode_prefix(self._prefix, self.settings.max_header_bytes,
                                       self.settings.max_frame_bytes)
            self._header = bytearray(self._lens[0])
            self._start(1, memoryview(self._header))
            return
        if self._stage == 1 and self._lens[1]:
            size = self._lens[1]
            self._direct = begin_direct(self.plane.ops, self.session, bytes(self._header), size)
            if self._direct is not None:
                self._start(2, self._direct.next_target() or memoryview(b""))
                return
            self._payload = self.plane.buffers.take(size)
            self._start(2, memoryview(self._payload)[:size])
            return
        payload = memoryview(self._payload)[:self._lens[1]] if self._stage == 2 \
            else memoryview(b"")
        self._disarm()
        assert self.transport is not None
        self.transport.pause_reading()
        self._stage = 3  # the frame is in: being served
        self._task = asyncio.ensure_future(self._serve(bytes(self._header), payload))

    def _start(self, stage: int, target: memoryview) -> None:
        self._stage, self._target, self._pos = stage, target, 0

    def _next_frame(self) -> None:
        self._start(0, memoryview(self._prefix))
        if self._direct is not None:
            self._direct.release_scratch()
            self._direct = None
        if self._payload:  # the op is done with it: back to the pool
            self.plane.buffers.give(self._payload)
            self._payload = bytearray()
        if not self.closed and self.transport is not None:
            self._arm(self.settings.idle_timeout_s)
            self.transport.resume_reading()

    # -- serving --------------------------------------------------------------------------
    async def _serve(self, header_bytes: bytes, payload: memoryview) -> None:
        start = time.perf_counter()
        rid: Any = 0
        op = "unknown"
        noreply = False
        self.plane.inflight += 1
        try:
            header = decode_header(header_bytes)
            rid = header.get("id", 0)
            rid = rid if isinstance(rid, int) and not isinstance(rid, bool) else 0
            noreply = header.get("noreply") is True
            name = header.get("op")
            op = name if isinstance(name, str) and name in self.plane.ops.table else "unknown"
            if self._direct is not None:
                fields, blobs = await self.plane.ops.commit_direct(self._direct)
            else:
                fields, blobs = await self.plane.ops.dispatch(self.session, header, payload)
            reply: dict[str, Any] = {"id": rid, "ok": True, **fields}
            status = "ok"
        except Exception as exc:
            code, message, fatal = _describe(exc, op)
            reply, blobs, status = {"id": rid, "ok": False,
                                    "error": {"code": code, "message": message}}, [], code
            if fatal:
                noreply = False
                self._close_after = True
        finally:
            self.plane.inflight -= 1
        self.plane.metrics.observe("data", op, status, time.perf_counter() - start)
        if not noreply:
            await self._send(encode_frame(reply, blobs))
        if self._close_after:
            if self.transport is not None:
                self.transport.close()
            return
        self._next_frame()

    async def _send(self, pieces: list[Buffer]) -> None:
        if self.closed or self.transport is None:
            return
        for piece in pieces:  # one write each: no join, the kernel copies from our buffers
            self.transport.write(piece)
        if not self._writable.is_set():  # a client that does not read its replies
            try:
                await asyncio.wait_for(self._writable.wait(), self.settings.frame_timeout_s)
            except TimeoutError:
                self._abort()

    def _fail(self, exc: FrameError) -> None:
        assert self.transport is not None
        self.plane.metrics.observe("data", "unknown", exc.code, 0.0)
        reply = {"id": 0, "ok": False, "error": {"code": exc.code, "message": exc.message}}
        for piece in encode_frame(reply):
            self.transport.write(piece)
        self.transport.close()  # flushes the error frame, then closes

    # -- timers ---------------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._abort)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()


def _describe(exc: Exception, op: str) -> tuple[str, str, bool]:
    """``(code, message, fatal)`` for an error raised while serving a frame."""
    if isinstance(exc, FrameError):
        return exc.code, exc.message, exc.fatal
    mapped = map_error(exc)
    if mapped is not None:
        return mapped.code, str(exc), mapped.code == "unauthenticated"
    log.exception("unexpected error serving data plane op %s", op)
    return "internal", f"internal error: {type(exc).__name__}", False


class DataPlane:
    """Both listeners, the worker pool, the connection set and the lease reaper."""

    def __init__(self, store: Any, settings: ServerSettings, ops_info: dict[str, Any],
                 auth: Any, metrics: ServerMetrics, durable_tier: str | None) -> None:
        from server.auth import ADMIN

        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.auth_on = auth.enabled
        self.admin = ADMIN
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kvstore-data")
        self.buffers = BufferPool(settings.recv_buffer_bytes)
        self.ops = Ops(store, settings, auth, ops_info, durable_tier, self._run)
        self.ops.buffers = self.buffers
        self.connections: set[Connection] = set()
        self.inflight = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.settings
        if s.data_port:
            self._servers.append(await loop.create_server(
                lambda: Connection(self), s.host, s.data_port, reuse_address=True, backlog=512))
        path = s.socket_path
        if path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a stale socket from a crashed run (the data dir is locked)
            self._servers.append(await loop.create_unix_server(
                lambda: Connection(self), path, backlog=512))
            os.chmod(path, 0o600)
        self._reaper = asyncio.ensure_future(self._reap())

    def opened(self, conn: Connection) -> None:
        if len(self.connections) >= self.settings.max_connections:
            log.warning("data plane: connection limit %d reached", self.settings.max_connections)
            conn._fail(FrameError("busy", "too many connections"))
            return
        self.connections.add(conn)
        self.metrics.connections.inc()

    def closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
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
        # Not the owner's grants (GRANT_SUFFIX): other processes may be copying them; they
        # go when released or when their lease runs out.
        try:
            for who in (owner, owner + READ_SUFFIX):
                self.store.expire_leases(who)
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
        """Stop accepting, let in-flight requests finish (up to ``grace_s``), then close every
        connection."""
        self._closing = True
        for server in self._servers:
            server.close()
        deadline = time.monotonic() + grace_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self._reaper is not None:
            self._reaper.cancel()
        self.executor.shutdown(wait=True)
        path = self.settings.socket_path
        if path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
