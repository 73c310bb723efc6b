"""Data plane operations: read a request header, check the caller, call the store.

Every op validates its arguments on the event loop (cheap, and a bad frame never reaches the
store), then runs its store call in a worker thread: one thread hop per batch, never per
block. ``prefetch`` only queues work for the store's prefetch threads, on the event loop. The
small ops of the shared-memory path and of routing (``shm_*``, ``lookup``, ``release``) first
try their store call on the event loop with ``nowait=True``: it either finishes in memory
without waiting, or raises ``WouldBlock`` having changed nothing, and then goes to a worker
thread. The hop costs more than such an op on a busy host, and a local put is two of them.
Each op returns ``(reply fields, payload buffers)``.

Pins and shared-memory reservations belong to the session's ``owner`` (chosen by the client
in ``hello`` so that all its connections share it); reads through shared memory pin under
``owner + "#read"`` so that releasing them never drops a pin the client took with ``pin``.
The ``shm_*`` ops are in :mod:`server.dataplane.shm_ops`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kvstore.errors import WouldBlock
from kvstore.namespace import Layout, Namespace
from kvstore.protocol.frame import (
    Buffer,
    FrameError,
    arg_bool,
    arg_float,
    arg_hashes,
    arg_int,
    arg_sizes,
    arg_str,
    split_payload,
)
from server.auth import Authenticator, Principal
from server.dataplane.buffers import BufferPool
from server.dataplane.direct_put import DirectPut
from server.dataplane.shm_ops import SharedMemoryOps
from server.errors import AuthError
from server.settings import ServerSettings
from server.writes import durable_put

Reply = tuple[dict[str, Any], list[Buffer]]


@dataclass(slots=True)
class Session:
    """One connection's identity: its principal (None until ``hello`` when auth is on)."""

    principal: Principal | None
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)


class Ops(SharedMemoryOps):
    """The op table of the data plane over one store."""

    def __init__(self, store: Any, settings: ServerSettings, auth: Authenticator,
                 info: dict[str, Any], durable_tier: str | None,
                 run: Callable[..., Awaitable[Any]]) -> None:
        self.store = store
        self.settings = settings
        self.auth = auth
        self.info = info
        self.buffers = BufferPool(0)  # the data plane's pool, set by DataPlane
        self.durable_tier = durable_tier
        self.run = run  # run(fn, *args) in the worker pool
        self.shm = info.get("shm") is not None
        self.table: dict[str, Callable[[Session, dict[str, Any], memoryview], Awaitable[Reply]]]
        self.table = {
            "hello": self.hello, "ping": self.ping, "register": self.register,
            "namespaces": self.namespaces, "put": self.put, "get": self.get,
            "lookup": self.lookup, "prefetch": self.prefetch, "pin": self.pin,
            "release": self.release, "delete": self.delete, "stats": self.stats,
            "health": self.health, "flush": self.flush,
            "shm_reserve": self.shm_reserve, "shm_commit": self.shm_commit,
            "shm_abort": self.shm_abort, "shm_acquire": self.shm_acquire,
            "shm_release": self.shm_release, "shm_stage": self.shm_stage,
            "shm_put": self.shm_put, "shm_lookup": self.shm_lookup,
        }

    async def dispatch(self, session: Session, header: dict[str, Any],
                       payload: memoryview) -> Reply:
        op = header.get("op")
        handler = self.table.get(op) if isinstance(op, str) else None
        if handler is None:
            raise FrameError("unknown_op", f"unknown op {op!r}; known: {', '.join(self.table)}")
        if session.principal is None and op != "hello":
            raise AuthError("authenticate with a 'hello' frame carrying the token first")
        if payload.nbytes and op != "put":
            raise FrameError("bad_request", f"op {op!r} takes no payload")
        return await handler(session, header, payload)

    # -- helpers --------------------------------------------------------------------------
    def _ns(self, session: Session, header: dict[str, Any]) -> Namespace:
        assert session.principal is not None
        ns: Namespace = self.store.namespace(arg_str(header, "ns"))
        return session.principal.check(ns)

    def _hashes(self, header: dict[str, Any]) -> list[bytes]:
        return arg_hashes(header, self.settings.max_batch)

    async def _now(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args, nowait=True)`` here on the event loop, or ``fn(*args)`` in a worker
        thread if that would block."""
        try:
            return fn(*args, nowait=True)
        except WouldBlock:
            return await self.run(fn, *args)

    # -- session --------------------------------------------------------------------------
    async def hello(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        token = header.get("token")
        if token is not None and not isinstance(token, str):
            raise FrameError("bad_request", "field 'token' must be a string")
        session.principal = self.auth.authenticate(token)
        owner = arg_str(header, "owner", optional=True)
        if owner is not None:
            if len(owner) > 128:
                raise FrameError("bad_request", "field 'owner' is longer than 128 characters")
            # scoped by tenant: a client of one tenant can never release another's pins
            session.owner = f"{session.principal.tenant or '*'}/{owner}"
        return {**self.info, "owner": session.owner}, []

    async def ping(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        return {}, []

    async def register(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        assert session.principal is not None
        layout = header.get("layout") or {}
        if not isinstance(layout, dict):
            raise FrameError("bad_request", "field 'layout' must be a map")
        try:
            ns = Namespace(
                name=arg_str(header, "name"), block_bytes=arg_int(header, "block_bytes"),
                layout=Layout(**layout), hash_algo=header.get("hash_algo", "sha256"),
                hash_seed=header.get("hash_seed"),
                tenant=session.principal.tenant_for_new(header.get("tenant")),
            )
        except (TypeError, ValueError) as exc:
            raise FrameError("invalid_request", str(exc)) from None
        if ns.name in {n.name for n in self.store.namespaces()}:
            session.principal.check(self.store.namespace(ns.name))
        created = await self.run(self.store.register_namespace, ns)
        return {"created": created, "namespace": self.store.namespace(ns.name).to_dict()}, []

    async def namespaces(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        assert session.principal is not None
        seen = [ns.to_dict() for ns in self.store.namespaces()
                if session.principal.can_access(ns)]
        return {"namespaces": seen}, []

    # -- blocks over the socket ----------------------------------------------------------
    async def commit_direct(self, direct: DirectPut) -> Reply:
        """Finish a put whose payload was read straight into the host tier (direct_put)."""
        result = await self._now(direct.commit)
        return result._asdict(), []

    async def put(self, session: Session, header: dict[str, Any], payload: memoryview) -> Reply:
        ns = self._ns(session, header)
        hashes = self._hashes(header)
        blocks = split_payload(payload, arg_sizes(header, len(hashes), payload.nbytes))
        for block in blocks:  # refuse before storing anything: no block partially visible
            ns.check_size(block.nbytes)
        durable = arg_bool(header, "durable")
        result = await self.run(durable_put, self.store, ns.name, hashes, blocks, durable,
                                self.durable_tier)
        return result._asdict(), []

    async def get(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        ns = self._ns(session, header)
        blocks = await self.run(self.store.get, ns.name, self._hashes(header))
        sizes = [-1 if b is None else len(b) for b in blocks]
        return {"sizes": sizes}, [b for b in blocks if b is not None]

    # -- index and pins -------------------------------------------------------------------
    async def lookup(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        ns = self._ns(session, header)
        result = await self._now(self.store.lookup, ns.name, self._hashes(header))
        return {"prefix_blocks": result.prefix_blocks, "tiers": list(result.tiers)}, []

    async def prefetch(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        ns = self._ns(session, header)
        hashes = self._hashes(header)
        # Only queues the work on the store's prefetch threads: no need for a hop of our own
        # (which would hold up the next frame on this connection, often the lookup).
        self.store.prefetch(ns.name, hashes)
        return {"accepted": len(hashes)}, []

    async def pin(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        ns = self._ns(session, header)
        pinned = await self.run(self._pin, ns.name, self._hashes(header),
                                arg_float(header, "lease_s"), session.owner)
        return {"pinned": pinned}, []

    def _pin(self, ns: str, hashes: list[bytes], lease_s: float | None, owner: str) -> Any:
        return self.store.pin(ns, hashes, lease_s=lease_s, owner=owner)

    async def release(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        ns = self._ns(session, header)
        n = await self._now(self._release, ns.name, self._hashes(header), session.owner)
        return {"released": n}, []

    def _release(self, ns: str, hashes: list[bytes], owner: str, nowait: bool = False) -> int:
        released: int = self.store.release(ns, hashes, owner=owner, nowait=nowait)
        return released

    async def delete(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        ns = self._ns(session, header)
        return {"deleted": await self.run(self.store.delete, ns.name, self._hashes(header))}, []

    async def stats(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        assert session.principal is not None
        doc = await self.run(self.store.stats)
        visible = {ns.name for ns in self.store.namespaces() if session.principal.can_access(ns)}
        doc["namespaces"] = {k: v for k, v in doc["namespaces"].items() if k in visible}
        return {"stats": doc}, []

    async def health(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        return {"health": await self.run(self.store.health)}, []

    async def flush(self, session: Session, header: dict[str, Any], _: memoryview) -> Reply:
        await self.run(self.store.flush)
        return {}, []

async def run_in(executor: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in ``executor`` from the event loop."""
    return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
