"""One data plane connection: reads frames (see :mod:`kvstore.protocol.frame`) within the
plane's byte budget, guards the trust boundary, has each frame answered (``answer``) and the
reply written (``replies``).

Each connection is an ``asyncio.BufferedProtocol`` that receives every frame piece straight
into its final buffer (the payload lands once, where the store reads it). A connection serves
one frame at a time: reading pauses while a request runs, so replies keep request order and a
client cannot queue unbounded work. Concurrency comes from many connections.

Faults: a frame that starts must complete within ``frame_timeout_s`` and a silent connection
is closed after ``idle_timeout_s`` (slowloris); a bad header gets an error frame and the
connection keeps serving; broken framing (oversized or empty header) gets an error frame and
a close.

Trust boundary: until its ``hello`` succeeds (with auth off: until its first frame starts) a
connection is *pending*: it must get there within ``hello_timeout_s``, its frames may hold at
most ``max_unauth_frame_bytes``, and pending connections are limited apart from established
ones (see :class:`~server.dataplane.server.DataPlane`). A frame's bytes are taken from the
plane's :class:`~server.dataplane.budget.ByteBudget` before any buffer is allocated for them;
a frame that finds no room waits up to ``frame_budget_wait_s`` with reading paused, then gets
a ``busy`` error frame and a close (its payload is still on the wire).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import TYPE_CHECKING, Any

from kvstore.protocol.frame import PREFIX_BYTES, FrameError, decode_prefix, encode_frame
from server.dataplane.answer import answer, busy_reply
from server.dataplane.buffers import SMALL
from server.dataplane.context import Session
from server.dataplane.direct_put import DirectPut
from server.dataplane.direct_put import begin as begin_direct
from server.dataplane.fd_pass import is_unix
from server.dataplane.replies import ReplyWriter

if TYPE_CHECKING:
    from server.dataplane.server import DataPlane


class Connection(asyncio.BufferedProtocol):
    """One client's connection to ``plane``: one frame at a time, in request order."""

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
        self._replies = ReplyWriter(self.settings.frame_timeout_s)
        self._task: asyncio.Task[None] | None = None
        self._close_after = False  # the frame broke the session (auth): close after replying
        self._direct: DirectPut | None = None  # a put read straight into the host tier
        self.established = False  # authenticated (or, with auth off, sent a frame)
        self.budget = plane.ops.ctx.budget
        self._held = 0  # budget bytes the frame being received or served holds
        self._waiting: asyncio.Task[None] | None = None  # waiting for budget room
        self._hello_timer: asyncio.TimerHandle | None = None
        self._refused = ""  # why promotion failed (a busy message)

    @property
    def closed(self) -> bool:
        """The connection is gone (``connection_lost`` ran)."""
        return self._replies.closed

    # -- asyncio protocol -----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # big blocks: fewer, larger reads and writes
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        self.session.unix = is_unix(transport)
        self._replies.attach(transport)
        self.plane.opened(self)
        self._arm(self.settings.idle_timeout_s)
        self._hello_timer = asyncio.get_running_loop().call_later(
            self.settings.hello_timeout_s, self._hello_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._replies.detach()
        self._disarm()
        self._stop_hello_timer()
        if self._waiting is not None:
            self._waiting.cancel()  # takes nothing from the budget once cancelled
        direct = self._direct
        if direct is not None and self._stage == 2:  # the payload never completed
            self.plane.background(direct.abort)
        if self._stage in (1, 2):  # receiving, not serving: nothing else will give it back
            self._release()
        self.plane.closed(self)

    def pause_writing(self) -> None:
        self._replies.pause()

    def resume_writing(self) -> None:
        self._replies.resume()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._target[self._pos:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._stage == 0 and self._pos == 0:  # first bytes of a frame: it must finish
            self._arm(self.settings.frame_timeout_s)
            if not self.established and self.session.principal is not None \
                    and not self._promote():  # auth off: the first frame establishes
                return
        self._pos += nbytes
        if self._stage == 2 and self._direct is not None:
            self._direct.landed(nbytes)  # hashed now, while the bytes are in cache
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
            self._lens = self._check_prefix()
            need = sum(self._lens)
            if need > SMALL and not self.budget.try_take(need):
                self._wait_for_room(need)
                return
            self._begin_header(need)
            return
        if self._stage == 1 and self._lens[1]:
            size = self._lens[1]
            self._direct = begin_direct(self.plane.ops, self.session, bytes(self._header), size)
            if self._direct is not None:  # the payload goes to the slab: no buffer for it
                if self._held:
                    self.budget.give(size)
                    self._held -= size
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

    def _check_prefix(self) -> tuple[int, int]:
        lens = decode_prefix(self._prefix, self.settings.max_header_bytes,
                             self.settings.max_frame_bytes)
        limit = self.settings.max_unauth_frame_bytes
        if self.session.principal is None and sum(lens) > limit:
            raise FrameError(
                "too_large", f"a frame of {sum(lens)} bytes before authentication exceeds the "
                f"{limit}-byte limit; send 'hello' with the token first", fatal=True)
        return lens

    def _begin_header(self, need: int) -> None:
        """Budget taken (frames up to SMALL bytes take none): receive the header."""
        self._held = need if need > SMALL else 0
        self._header = bytearray(self._lens[0])
        self._start(1, memoryview(self._header))

    def _wait_for_room(self, need: int) -> None:
        assert self.transport is not None
        self.transport.pause_reading()
        self._disarm()  # the frame's clock starts again once it has room
        self._waiting = asyncio.ensure_future(self._room(need))

    async def _room(self, need: int) -> None:
        got = await self.budget.take(need, self.settings.frame_budget_wait_s)
        self._waiting = None
        if self.closed or self.transport is None:
            if got:
                self.budget.give(need)
            return
        if not got:
            self._fail(FrameError(
                "busy", f"a frame of {need} bytes found no room within "
                f"{self.settings.frame_budget_wait_s} s in the server's "
                f"{self.budget.total}-byte budget for frames in memory; retry later",
                fatal=True))
            return
        self._begin_header(need)
        self._arm(self.settings.frame_timeout_s)
        self.transport.resume_reading()

    def _release(self) -> None:
        """Give back the budget the current frame and its reply hold."""
        held, self._held = self._held + self.session.reply_bytes, 0
        self.session.reply_bytes = 0
        if held:
            self.budget.give(held)

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
        self._release()
        if not self.closed and self.transport is not None:
            self._arm(self.settings.idle_timeout_s)
            self.transport.resume_reading()

    # -- serving --------------------------------------------------------------------------
    async def _serve(self, header_bytes: bytes, payload: memoryview) -> None:
        start = time.perf_counter()
        self.plane.inflight += 1
        try:
            rid, op, reply, blobs, status, noreply, fatal = await answer(
                self.plane.ops, self.session, self._direct, header_bytes, payload)
            if fatal:
                self._close_after = True
            elif status == "ok" and not self.established and self.session.principal is not None \
                    and not self._promote():  # hello succeeded, but no slot is free
                reply, blobs, status = busy_reply(rid, self._refused), [], "busy"
                self._close_after = True
        finally:
            self.plane.inflight -= 1
        self.plane.metrics.observe("data", op, status, time.perf_counter() - start)
        if self.session.send_fds:  # shm_map: the slab's descriptor goes with the reply
            fds, self.session.send_fds = self.session.send_fds, []
            unsent = self._replies.send_fds(reply, rid, fds)
            noreply, reply = noreply or unsent is None, unsent or reply
        after, self.session.after_send = self.session.after_send, None
        try:
            if not noreply:
                await self._replies.send(encode_frame(reply, blobs), drain=after is not None)
        finally:
            if after is not None:  # the kernel has every byte: the borrowed memory is free
                await after()
        if self._close_after:
            self._release()
            if self.transport is not None:
                self.transport.close()
            return
        self._next_frame()

    def _fail(self, exc: FrameError) -> None:
        self.plane.metrics.observe("data", "unknown", exc.code, 0.0)
        self._replies.fail(exc)

    # -- the trust boundary ---------------------------------------------------------------
    def _promote(self) -> bool:
        """Pending to established; False (and, outside a frame being served, an error frame
        and a close) when no established slot is free for it (``max_connections``, or its
        tenant's ``max_connections_per_tenant``); ``_refused`` then says which."""
        self._stop_hello_timer()
        refused = self.plane.promote(self)
        if refused is None:
            return True
        self._refused = refused
        if self._stage != 3:
            self._fail(FrameError("busy", refused))
        return False

    def _hello_expired(self) -> None:
        self._hello_timer = None
        if not self.established and not self.closed and self._stage != 3:
            self._fail(FrameError("unauthenticated", f"no successful 'hello' within "
                                                     f"{self.settings.hello_timeout_s} s"))

    def _stop_hello_timer(self) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None

    # -- timers ---------------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._abort)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _abort(self) -> None:
        self._replies.abort()
