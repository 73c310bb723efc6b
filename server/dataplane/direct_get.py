"""Socket gets sent straight from the host tier: the kernel copies each block from the slab to
the socket, with no copy (and no allocation) on the way.

A ``get`` pins the requested blocks that the host tier holds, under an owner of its own (the
shared-memory path's ``acquire_read`` with ``promote=False``: blocks held only below are not
touched here), and its reply's payload is views of their places in the slab. The connection
drops the pins once the kernel has taken every byte of the reply, or the connection is gone.
Blocks the host tier does not hold are read the usual way
(:func:`~server.dataplane.get_reply.read_within`: from a lower tier, verified and promoted as
the store's ``get`` does), so a reply may mix views and copies. A pinned block is never
evicted, and a deleted one keeps its slots until its pins would have expired, so the bytes
sent are always the block's unless a late shared-memory writer overwrote them. The reply
carries the recorded checksums so that the client verifies what it received, and before
sending, each pinned block is hashed where it lies and compared with its checksum (one that
differs is a miss and is dropped), except for a client that says it checks what lands
(``checked``) and is trusted with the slab: it could read the same bytes by mapping it, so
its own check is enough, and it reports a block that fails with ``check``. The pins' lease
outlives the connection's ``frame_timeout_s`` (after which a reply still unsent aborts the
connection), and the frame budget bounds what the gets in flight may pin, as it bounds the
copies they would otherwise make.

The pins are charged to the caller's tenant like any other (``max_pinned_bytes_per_tenant``):
a client that never reads its replies holds them until the frame timeout, and must not hold
more of the host tier that way than by pinning. A get that would take its tenant past the
quota is served by copy instead, within the same frame budget, so what a tenant's replies in
flight hold is its quota pinned at most, plus copies within the budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from kvstore.errors import PinQuotaError
from kvstore.protocol import Buffer
from kvstore.store import StoreAPI
from kvstore.types import BlockHash
from server.dataplane.get_reply import read_within
from server.dataplane.slab_runs import Extent, coalesce, transfer_lease_s

# The pins' owner id starts with NUL, which no session owner does: a client picks its owner in
# ``hello`` (stored as "tenant/name"), and one naming "<another's owner>#send<n>" could drop
# the pins of another connection's reply still being sent from the slab (its release, or its
# last connection closing), so the slots went to another tenant's blocks mid-send.
SEND_OWNER = "\x00send/"
INLINE_HASH_BYTES = 4 << 20  # a reply's slab bytes hashed in the event loop; more: a thread
_ids = itertools.count()


class GetPayload(NamedTuple):
    """A get reply's blocks: each one's size (-1: a miss), the payload's pieces in order,
    what to call once they are sent (None when nothing is pinned), and the recorded checksum
    of each block sent out of the slab (None for the others: copies verified when read)."""

    sizes: list[int]
    pieces: list[Buffer]
    after_send: Callable[[], Awaitable[None]] | None
    sums: list[int | None] | None = None


class DirectGet:
    """Serves gets over one store whose top tier is a host slab (see module doc)."""

    def __init__(self, store: StoreAPI, now: Callable[..., Awaitable[Any]],
                 run: Callable[..., Awaitable[Any]], lease_s: float) -> None:
        self.store = store
        self.host: Any = store.tier("host")
        self._now = now  # ctx.now: here if it does not block, else in a worker thread
        self._run = run
        self.lease_s = lease_s

    async def read(self, ns: str, hashes: list[BlockHash], block_bytes: int,
                   limit: int, owner: str, tenant: str | None, *,
                   checked_by_client: bool = False) -> GetPayload:
        """Each block of ``hashes``: a view of its pinned slab place where the host tier
        holds it (pins charged to ``tenant``; None: uncharged, the admin), else read and
        copied; all copied where the pins would pass the tenant's quota. The caller checked
        that the reply fits ``limit`` and holds its frame budget. ``checked_by_client``:
        the client verifies each block against the reply's checksums as it lands and reports
        one that differs (``check``), so the pinned blocks are not hashed before sending."""
        owner = f"{SEND_OWNER}{owner}/{next(_ids)}"
        try:
            pins = await self._now(self.store.acquire_read, ns, hashes, lease_s=self.lease_s,
                                   owner=owner, promote=False, tenant=tenant)
            extents, held = pins.extents, pins.sums  # no generation to check: the lease
            # outlives the send
        except PinQuotaError:  # nothing pinned: copies, within the budget the caller holds
            extents, held = [None] * len(hashes), [None] * len(hashes)
        pinned = [h for h, ext in zip(hashes, extents, strict=True) if ext is not None]

        async def release() -> None:
            await self._now(self.store.release, ns, pinned, owner=owner)

        try:
            if not checked_by_client:
                extents = await self._verified(ns, hashes, extents, held)
            rest = [h for h, ext in zip(hashes, extents, strict=True) if ext is None]
            copies = iter(await self._run(read_within, self.store, ns, rest, block_bytes,
                                          limit) if rest else ())
        except BaseException:
            if pinned:
                await release()
            raise
        sizes: list[int] = []
        parts: list[Extent | bytes] = []
        for ext in extents:
            if ext is not None:
                parts += ext
                sizes.append(sum(n for _, n in ext))
                continue
            block = next(copies)
            sizes.append(-1 if block is None else len(block))
            if block is not None:
                parts.append(block)
        slab: memoryview = self.host.view(0, self.host.slab_bytes) if pinned \
            else memoryview(b"")
        pieces: list[Buffer] = [slab[p[0]:p[0] + p[1]] if isinstance(p, tuple) else p
                                for p in coalesce(parts)]  # neighbours: one iovec
        sums = [s if ext is not None else None
                for s, ext in zip(held, extents, strict=True)]
        return GetPayload(sizes, pieces, release if pinned else None,
                          sums if any(s is not None for s in sums) else None)

    async def _verified(self, ns: str, hashes: list[BlockHash], extents: list[Any],
                        sums: list[int | None]) -> list[Any]:
        """``extents`` with None for each pinned block whose slab bytes no longer match its
        checksum (dropped from the store, counted with cause ``send``): a miss, never sent.
        The client checks the bytes it receives against the same checksums."""
        todo = [i for i, (ext, s) in enumerate(zip(extents, sums, strict=True))
                if ext is not None and s is not None]
        if not todo:
            return extents
        todo_ext = [extents[i] for i in todo]
        size = sum(n for ext in todo_ext for _, n in ext)
        got = self.host.sums(todo_ext) if size <= INLINE_HASH_BYTES \
            else await self._run(self.host.sums, todo_ext)
        bad = [i for i, s in zip(todo, got, strict=True) if s != sums[i]]
        if not bad:
            return extents
        await self._run(self.store.check_host, ns, [hashes[i] for i in bad], "send")
        out = list(extents)
        for i in bad:
            out[i] = None
        return out


def direct_get(store: StoreAPI, now: Callable[..., Awaitable[Any]],
               run: Callable[..., Awaitable[Any]], frame_timeout_s: float,
               max_lease_s: float) -> DirectGet | None:
    """A :class:`DirectGet` where the store's host tier is a slab and a lease can outlive
    the time a reply may take to send; None to copy every block."""
    if "host" not in store.tier_names() or store.host_slab() is None:
        return None
    lease_s = transfer_lease_s(frame_timeout_s, max_lease_s)
    return None if lease_s is None else DirectGet(store, now, run, lease_s)
