"""Data plane operations: read a request header, check the caller, call the store.

Every op validates its arguments on the event loop (cheap, and a bad frame never reaches the
store), then runs its store call in a worker thread: one thread hop per batch, never per
block. ``prefetch`` only queues work for the store's prefetch threads, within bounds
(:mod:`server.dataplane.prefetch_share`). The small ops of the shared-memory path and of
routing (``shm_*``, ``lookup``, ``release``, a small ``prefetch``) first
try their store call on the event loop with ``nowait=True``: it either finishes in memory
without waiting, or raises ``WouldBlock`` having changed nothing, and then goes to a worker
thread. The hop costs more than such an op on a busy host, and a local put is two of them.
Each op takes its typed request (:mod:`kvstore.protocol`, validated by :meth:`Ops.dispatch`
before the handler runs) and returns ``(reply, payload buffers)``.

Pins and shared-memory reservations belong to the session's ``owner`` (chosen by the client
in ``hello`` so that all its connections share it); reads through shared memory pin under
``owner + "#read"`` so that releasing them never drops a pin the client took with ``pin``.
The ``shm_*`` ops are in :mod:`server.dataplane.shm_ops`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kvstore.namespace import Namespace
from kvstore.protocol import (
    Ack,
    Buffer,
    Check,
    Delete,
    DeleteNamespace,
    DeleteNamespaceReply,
    DeleteReply,
    Flush,
    FrameError,
    Get,
    GetReply,
    Header,
    Health,
    HealthReply,
    Hello,
    HelloReply,
    Limits,
    Lookup,
    LookupReply,
    Namespaces,
    NamespacesReply,
    Pin,
    Ping,
    PinReply,
    Prefetch,
    PrefetchReply,
    Put,
    PutReply,
    Register,
    RegisterReply,
    Release,
    ReleaseReply,
    Request,
    Stats,
    StatsReply,
    request_type,
)
from kvstore.protocol.cluster import PEER_OWNER
from kvstore.protocol.frame import split_payload
from kvstore.protocol.info import ServerInfo
from kvstore.store import StoreAPI
from kvstore.types import BlockHash
from server.auth import Authenticator
from server.dataplane.buffers import SMALL, BufferPool
from server.dataplane.context import Answer, Handler, OpsContext, Session
from server.dataplane.direct_get import direct_get
from server.dataplane.direct_put import DirectPut
from server.dataplane.get_reply import read_within, reply_bound
from server.dataplane.prefetch_share import PrefetchShare
from server.dataplane.shm_ops import SharedMemoryOps
from server.errors import AuthError
from server.settings import ServerSettings
from server.tenant_view import (
    as_seen,
    to_register,
    visible,
    visible_health,
    visible_info,
    visible_stats,
)
from server.writes import durable_put

if TYPE_CHECKING:
    from server.peer_fill import PeerFill


class Ops:
    """The op table of the data plane over one store: the session and block ops here, the
    ``shm_*`` ops in :class:`~server.dataplane.shm_ops.SharedMemoryOps`."""

    def __init__(self, store: StoreAPI, settings: ServerSettings, auth: Authenticator,
                 info: ServerInfo, durable_tier: str | None,
                 run: Callable[..., Awaitable[Any]], fill: PeerFill | None = None) -> None:
        self.ctx = OpsContext(store, settings, run, fill)
        self.store = store
        self.settings = settings
        self.auth = auth
        self.info = info
        self.buffers = BufferPool(0)  # the data plane's pool, set by DataPlane
        self.durable_tier = durable_tier
        self.run = run
        self.shm_ops = SharedMemoryOps(self.ctx, enabled=info.shm is not None)
        self.direct_get = direct_get(store, self.ctx.now, run, settings.frame_timeout_s,
                                     settings.max_lease_s)
        self.prefetches = PrefetchShare(self.ctx, settings.max_prefetch_blocks_per_connection)
        self.table: dict[type[Request], Handler] = {
            Hello: self.hello, Ping: self.ping, Register: self.register,
            Namespaces: self.namespaces, Put: self.put, Get: self.get, Check: self.shm_ops.check,
            Lookup: self.lookup,
            Prefetch: self.prefetch, Pin: self.pin, Release: self.release,
            Delete: self.delete, Stats: self.stats, Health: self.health, Flush: self.flush,
            **self.shm_ops.table(),
            DeleteNamespace: self.delete_namespace,
        }

    async def dispatch(self, session: Session, header: Header,
                       payload: memoryview) -> tuple[Header, list[Buffer]]:
        """Check, decode and serve one request; ``(reply fields, payload buffers)``."""
        kind = request_type(header.get("op"))
        if session.principal is None and not kind.before_hello:
            raise AuthError("authenticate with a 'hello' frame carrying the token first")
        if payload.nbytes and not kind.takes_payload:
            raise FrameError("bad_request", f"op {kind.op!r} takes no payload")
        if kind.needs_shm:
            self.shm_ops.require(session)
        request = kind.from_header(header, Limits(self.settings.max_batch, payload.nbytes))
        reply, blobs = await self.table[kind](session, request, payload)
        return reply.to_header(), blobs

    # -- session --------------------------------------------------------------------------
    async def hello(self, session: Session, req: Hello, _: memoryview) -> Answer:
        session.principal = self.auth.authenticate(req.token)
        if req.owner is not None:
            # scoped by tenant: a client of one tenant can never release another's pins
            session.owner = f"{session.principal.tenant or '*'}/{req.owner}"
            session.from_peer = req.owner.startswith(PEER_OWNER)
        return HelloReply(visible_info(self.info, session.principal), session.owner), []

    async def ping(self, session: Session, req: Ping, _: memoryview) -> Answer:
        return Ack(), []

    async def register(self, session: Session, req: Register, _: memoryview) -> Answer:
        principal = session.principal
        assert principal is not None
        try:
            asked = Namespace(
                name=req.name, block_bytes=req.block_bytes, layout=req.layout,
                hash_algo=req.hash_algo, hash_seed=req.hash_seed)
            ns = to_register(self.store, principal, asked, req.tenant)
        except (TypeError, ValueError) as exc:
            raise FrameError("invalid_request", str(exc)) from None
        created = await self.run(self.store.register_namespace, ns)
        held = as_seen(principal, self.store.namespace(ns.name))
        return RegisterReply(created, held, ns.name), []

    async def namespaces(self, session: Session, req: Namespaces, _: memoryview) -> Answer:
        principal = session.principal
        assert principal is not None
        seen = [as_seen(principal, ns) for ns in visible(self.store, principal)]
        return NamespacesReply(seen), []

    # -- blocks over the socket ----------------------------------------------------------
    async def commit_direct(self, direct: DirectPut) -> tuple[Header, list[Buffer]]:
        """Finish a put whose payload was read straight into the host tier (direct_put)."""
        result = await self.ctx.now(direct.commit)
        return PutReply(*result).to_header(), []

    async def put(self, session: Session, req: Put, payload: memoryview) -> Answer:
        ns = self.ctx.ns(session, req.ns)
        req.read_trailer(payload[payload.nbytes - req.trailer_bytes:])
        blocks = split_payload(payload, req.sizes)
        for block in blocks:  # refuse before storing anything: no block partially visible
            ns.check_size(block.nbytes)
        result = await self.run(durable_put, self.store, ns.name, req.hashes, blocks,
                                req.durable, self.durable_tier, req.sums)
        return PutReply(*result), []

    async def get(self, session: Session, req: Get, _: memoryview) -> Answer:
        ns = self.ctx.ns(session, req.ns)
        await self.ctx.reach(session, ns, req.hashes)
        limit = self.settings.max_frame_bytes
        need = reply_bound(req.hashes, ns.block_bytes, limit)
        budget = self.ctx.budget
        if need > SMALL:  # held until the reply is sent (the connection gives it back)
            if not await budget.take(need, self.settings.frame_budget_wait_s):
                raise FrameError("busy", f"no room for a {need}-byte get reply in the "
                                         f"server's {budget.total}-byte budget; retry later")
            session.reply_bytes += need
        if self.direct_get is not None and len(req.hashes) * ns.block_bytes <= limit:
            # the reply fits whatever hits: blocks the host tier holds go out of the slab
            # a client that checks what lands and is trusted with the slab (it could map
            # it) needs no hash before the send: one pass over the bytes, not two
            got = await self.direct_get.read(
                ns.name, req.hashes, ns.block_bytes, limit, session.owner, session.tenant,
                checked_by_client=req.checked and self.shm_ops.trusts(session))
            session.after_send = got.after_send
            return GetReply(got.sizes, got.sums), got.pieces
        blocks = await self.run(read_within, self.store, ns.name, req.hashes, ns.block_bytes,
                                limit)
        sizes = [-1 if b is None else len(b) for b in blocks]
        return GetReply(sizes), [b for b in blocks if b is not None]

    # -- index and pins -------------------------------------------------------------------
    async def lookup(self, session: Session, req: Lookup, _: memoryview) -> Answer:
        ns = self.ctx.ns(session, req.ns)
        await self.ctx.reach(session, ns, req.hashes)
        result = await self.ctx.now(self.store.lookup, ns.name, req.hashes)
        return LookupReply(result.prefix_blocks, list(result.tiers)), []

    async def prefetch(self, session: Session, req: Prefetch, _: memoryview) -> Answer:
        """Queue the blocks on the store's prefetch threads (see :mod:`server.dataplane.
        prefetch_share`: ``busy`` past this connection's share or the store's queue)."""
        ns = self.ctx.ns(session, req.ns)
        await self.prefetches.queue(session, ns.name, req.hashes)
        return PrefetchReply(len(req.hashes)), []

    async def pin(self, session: Session, req: Pin, _: memoryview) -> Answer:
        ns = self.ctx.ns(session, req.ns)
        pinned = await self.run(self._pin, ns.name, req.hashes, req.lease_s, session.owner,
                                session.tenant)
        return PinReply(pinned), []

    def _pin(self, ns: str, hashes: list[BlockHash], lease_s: float | None, owner: str,
             tenant: str | None) -> Any:
        return self.store.pin(ns, hashes, lease_s=lease_s, owner=owner, tenant=tenant)

    async def release(self, session: Session, req: Release, _: memoryview) -> Answer:
        ns = self.ctx.ns(session, req.ns)
        n = await self.ctx.now(self.store.release, ns.name, req.hashes, owner=session.owner)
        return ReleaseReply(n), []

    async def delete(self, session: Session, req: Delete, _: memoryview) -> Answer:
        ns = self.ctx.ns(session, req.ns)
        return DeleteReply(await self.run(self.store.delete, ns.name, req.hashes)), []

    async def stats(self, session: Session, req: Stats, _: memoryview) -> Answer:
        assert session.principal is not None  # the same view as REST's /v1/stats
        stats = await self.run(visible_stats, self.store, session.principal)
        return StatsReply(stats), []

    async def health(self, session: Session, req: Health, _: memoryview) -> Answer:
        assert session.principal is not None  # the same view as REST's /healthz with a token
        health = await self.run(self.store.health)
        return HealthReply(visible_health(health, session.principal)), []

    async def flush(self, session: Session, req: Flush, _: memoryview) -> Answer:
        await self.run(self.store.flush)
        return Ack(), []

    async def delete_namespace(self, session: Session, req: DeleteNamespace,
                               _: memoryview) -> Answer:
        ns = self.ctx.ns(session, req.name)  # a tenant may delete only its own
        return DeleteNamespaceReply(await self.run(self.store.delete_namespace, ns.name)), []
