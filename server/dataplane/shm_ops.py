"""Data plane ops of the shared-memory path: only control frames cross the socket.

A client on the server's host maps the host tier's slab and copies block bytes itself; these
ops hand out and take back extents in it (see :mod:`kvstore.store.host_path` and
:mod:`kvstore.store.staging`). Reads pin under ``owner + "#read"`` so that releasing them never
drops a pin the client took with ``pin``.

``shm_lookup`` is a lookup that also pins each block of the hit that the host tier holds right
now and returns its extents. An engine's scheduler asks it in place of ``lookup`` and hands the
extents to its workers, which then copy a hit with no round trip of their own (the scheduler
releases the pins with ``shm_release`` and ``grant: true`` once the workers are done). The
workers copying them are other processes, so these pins are not dropped the moment the
client's last connection closes: they get ``grant_grace_s`` more at most, then go.

Every lease is cut to the server's ``max_lease_s`` by the store, and every pin is charged to
the session's tenant (:attr:`Session.tenant`; the admin's are not charged).
"""

from __future__ import annotations

from typing import Any

from kvstore.protocol import (
    AbortReply,
    Check,
    CheckReply,
    ExtentsReply,
    FrameError,
    PutReply,
    ReleaseReply,
    Request,
    ShmAbort,
    ShmAcquire,
    ShmCheck,
    ShmCommit,
    ShmLookup,
    ShmLookupReply,
    ShmPut,
    ShmPutReply,
    ShmRelease,
    ShmReserve,
    ShmStage,
    StageReply,
)
from kvstore.protocol.shm import ShmMap, ShmMapReply
from kvstore.tiers.slots import Granted
from kvstore.types import BlockHash
from server.dataplane.context import Answer, Handler, OpsContext, Session
from server.errors import ForbiddenError

READ_SUFFIX = "#read"
# Grants (shm_lookup) pin under their own owner, which outlives the client's connections by
# grant_grace_s: the process that copies a grant is not the one holding the connection, and
# must not see the pins go the moment that connection drops. Released by shm_release with
# "grant", by the lease, or grant_grace_s after the client's last connection closed.
GRANT_SUFFIX = "#grant"


class SharedMemoryOps:
    """The ``shm_*`` ops over one store. Dispatch calls :meth:`require` before any of them."""

    def __init__(self, ctx: OpsContext, enabled: bool) -> None:
        self._ctx = ctx
        self._store = ctx.store
        self.enabled = enabled
        self._tenants = bool(ctx.settings.tenant_tokens)

    def table(self) -> dict[type[Request], Handler]:
        return {
            ShmReserve: self.shm_reserve, ShmCommit: self.shm_commit,
            ShmAbort: self.shm_abort, ShmAcquire: self.shm_acquire,
            ShmRelease: self.shm_release, ShmStage: self.shm_stage, ShmPut: self.shm_put,
            ShmLookup: self.shm_lookup, ShmMap: self.shm_map, ShmCheck: self.check,
        }

    def require(self, session: Session | None = None) -> None:
        """Refuse the ``shm_*`` ops where the server offers no slab, or to a principal it
        does not trust with the whole slab: with tenant tokens, only the admin token gets it
        (a tenant's client falls back to the socket), since the slab holds every tenant's
        blocks."""
        if not self.enabled:
            raise FrameError("unavailable", "the shared-memory path is off on this server")
        if session is not None and not self.trusts(session):
            raise ForbiddenError(
                "the shared-memory path is offered only to the admin token on a server with "
                "tenant tokens; move block bytes over the socket (use_shm=False)")

    def trusts(self, session: Session) -> bool:
        """Whether ``session`` may map the slab (all of it: every tenant's blocks)."""
        principal = session.principal
        return principal is not None and (principal.admin or not self._tenants)

    async def shm_map(self, session: Session, req: ShmMap, _: memoryview) -> Answer:
        """The slab itself: its descriptor goes with the reply (``SCM_RIGHTS``), so only
        over the Unix socket, to an authenticated, trusted session."""
        share = self._store.host_share()
        if share is None:
            raise FrameError("unavailable", "this server's host tier has no shareable slab")
        if not session.unix:
            raise FrameError("unavailable", "shm_map works only over the Unix socket")
        session.send_fds = [share.fd]
        return ShmMapReply(share.size, share.slot_bytes, share.gen_offset), []

    async def shm_reserve(self, session: Session, req: ShmReserve, _: memoryview) -> Answer:
        ns = self._ctx.ns(session, req.ns)
        reserved = await self._ctx.now(self._store.reserve_write, ns.name, req.hashes,
                                       lease_s=req.lease_s, owner=session.owner)
        return ExtentsReply(reserved.extents, reserved.gens), []

    async def shm_commit(self, session: Session, req: ShmCommit, _: memoryview) -> Answer:
        ns = self._ctx.ns(session, req.ns)
        result = await self._ctx.now(self._store.commit_write, ns.name, req.hashes,
                                     owner=session.owner, gens=req.gens, sums=req.sums)
        return PutReply(*result), []

    async def shm_abort(self, session: Session, req: ShmAbort, _: memoryview) -> Answer:
        ns = self._ctx.ns(session, req.ns)
        aborted = await self._ctx.run(lambda: self._store.abort_write(
            ns.name, req.hashes, owner=session.owner))
        return AbortReply(aborted), []

    async def shm_stage(self, session: Session, req: ShmStage, _: memoryview) -> Answer:
        """Staged places for later ``shm_put`` frames (see :mod:`kvstore.store.staging`)."""
        ns = self._ctx.ns(session, req.ns)
        staged = await self._stage(ns.name, req.count, session.owner)
        return StageReply(staged.places, staged.gens), []

    async def _stage(self, ns: str, count: int, owner: str) -> Any:
        """The store's ``FencedPlaces``: places and generations from one lock hold."""
        return await self._ctx.now(self._store.stage_write, ns, count, owner=owner)

    async def shm_put(self, session: Session, req: ShmPut, _: memoryview) -> Answer:
        """Publish blocks the client wrote into staged places, and stage as many places again
        (one round trip per local put)."""
        ns = self._ctx.ns(session, req.ns)
        result, used = await self._ctx.now(self._store.commit_staged, ns.name, req.hashes,
                                           req.places, owner=session.owner, gens=req.gens,
                                           sums=req.sums)
        places, gens = await self._stage(ns.name, len(used), session.owner) if used else ([], [])
        return ShmPutReply(result.stored, result.existing, result.refused, used, places, gens), []

    async def shm_acquire(self, session: Session, req: ShmAcquire, _: memoryview) -> Answer:
        ns = self._ctx.ns(session, req.ns)
        await self._ctx.reach(session, ns, req.hashes)
        # the generations come with the pins: read after, they might be another block's
        acquired = await self._ctx.now(
            self._store.acquire_read, ns.name, req.hashes, lease_s=req.lease_s,
            owner=session.owner + READ_SUFFIX, tenant=session.tenant)
        return ExtentsReply(acquired.extents, acquired.gens, acquired.sums), []

    async def shm_release(self, session: Session, req: ShmRelease, _: memoryview) -> Answer:
        ns = self._ctx.ns(session, req.ns)
        suffix = GRANT_SUFFIX if req.grant else READ_SUFFIX
        n = await self._ctx.now(self._store.release, ns.name, req.hashes,
                                owner=session.owner + suffix)
        return ReleaseReply(n), []

    async def check(self, session: Session, req: Check | ShmCheck, _: memoryview) -> Answer:
        """A reader's copy failed its checksum (``shm_check`` out of the slab, ``check``
        after a socket get): hash the host copies where they lie and drop the blocks that
        fail (cause ``client``). The client has counted its copy a miss."""
        ns = self._ctx.ns(session, req.ns)
        dropped = await self._ctx.run(lambda: self._store.check_host(ns.name, req.hashes))
        return CheckReply(dropped), []

    async def shm_lookup(self, session: Session, req: ShmLookup, _: memoryview) -> Answer:
        """``lookup``, plus the extents of each block of the hit that the host tier holds,
        pinned for ``lease_s`` under the owner's grants (None for a block held only below);
        ``shm_release`` with ``grant`` drops them."""
        ns = self._ctx.ns(session, req.ns)
        await self._ctx.reach(session, ns, req.hashes)
        n, tiers, granted = await self._ctx.now(self._lookup_acquire, ns.name, req.hashes,
                                                req.lease_s, session.owner + GRANT_SUFFIX,
                                                session.tenant)
        return ShmLookupReply(n, tiers, granted.extents, granted.gens, granted.sums), []

    def _lookup_acquire(self, ns: str, hashes: list[BlockHash], lease_s: float | None, owner: str,
                        tenant: str | None,
                        nowait: bool = False) -> tuple[int, list[str], Granted]:
        found = self._store.lookup(ns, hashes, nowait=nowait)
        n = found.prefix_blocks
        granted = self._store.acquire_read(
            ns, hashes[:n], lease_s=lease_s, owner=owner, nowait=nowait, promote=False,
            tenant=tenant) if n else Granted([], [], [])
        return n, list(found.tiers), granted
