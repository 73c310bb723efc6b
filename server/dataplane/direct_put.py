"""Socket puts read straight into the host tier: one copy (kernel to slab) instead of two.

A ``put`` frame's header arrives before its payload. When the header is a plain put (not
durable) of blocks of the namespace's size and the host tier has room without evicting,
:func:`begin` reserves host-slab places for the new blocks (the shared-memory path's
``reserve_write``, invisible to every reader) and the connection reads the blocks' bytes from
the socket into their places (neighbouring places as one run: :mod:`server.dataplane
.slab_runs`); blocks the store already has are read into a scratch buffer and dropped.
:meth:`DirectPut.commit` publishes them once the whole payload is in, and
:meth:`DirectPut.abort` frees them if the frame never completes (the connection dropped or
timed out, or the commit failed), so a block is never partially visible.

The places are never freed while its bytes may still arrive: they are reserved as *receiving*
(:mod:`kvstore.store.reservations`), so a namespace delete, the reservation's lease running out
or its owner's leases being dropped meanwhile only dooms them (the commit is then refused, the
block never visible) and they go back to the free list at this put's own commit or abort.
Every frame ends in one of the two (the connection aborts on loss, timeout and shutdown). The
lease is still longer than a frame may take (not the default lease).

Each block is hashed as its bytes land, a piece at a time while in cache
(:class:`~server.dataplane.landing.Landing`), and the commit refuses one whose bytes differ
from the checksum the client sent with the put (in its header, or in the trailer that lands
after the blocks). A late shared-memory writer's bytes that reach
a place after they landed are caught where every read out of the slab is: against the
recorded checksum, a miss, never the block.

Anything else (an odd header, a full host tier, a busy store, a frame timeout past
``max_lease_s``) returns None and the frame is read into a buffer and served as before; that
path also produces every error reply.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any, cast

from kvstore.errors import WouldBlock
from kvstore.protocol import Limits, Put
from kvstore.protocol.frame import decode_header
from kvstore.store import StoreAPI
from kvstore.types import PutResult
from server.dataplane.buffers import BufferPool
from server.dataplane.landing import Landing
from server.dataplane.slab_runs import Extent, coalesce, transfer_lease_s

# A put's own owner id, never derived from the session's: a client picks its owner in
# ``hello`` (stored as "tenant/name"), and one naming "<another's owner>#recv<n>" could drop,
# abort or commit another connection's put in flight. No session owner starts with NUL.
RECV_OWNER = "\x00recv/"
_ids = itertools.count()


class DirectPut:
    """One put frame being received into reserved host-slab places."""

    def __init__(self, store: StoreAPI, ns: str, put: Put, owner: str,
                 targets: list[memoryview], scratch: bytearray | None,
                 buffers: BufferPool, blocks: list[list[memoryview] | None]) -> None:
        self.store = store
        self.ns = ns
        self.put = put
        self.hashes = put.hashes
        self.owner = owner
        # a put that sends its checksums after its blocks: they land last, in a buffer
        self._trailer = bytearray(put.trailer_bytes)
        self._targets: Iterator[memoryview] = iter([*targets, memoryview(self._trailer)]
                                                   if put.trailer else targets)
        self._scratch = scratch
        self._buffers = buffers
        self.done = False
        self._landing = Landing(blocks)

    def next_target(self) -> memoryview | None:
        """The next place to receive payload bytes into, None once the payload is complete."""
        return next(self._targets, None)

    def landed(self, nbytes: int) -> None:
        """The next ``nbytes`` of the payload have arrived: hash them while in cache."""
        self._landing.landed(nbytes)

    def commit(self, nowait: bool = False) -> PutResult:
        """Publish the received blocks (the store's ``commit_write``, given the checksums of
        the bytes as they landed; it refuses those that differ from the client's ``sums``);
        if that fails (other than :class:`~kvstore.errors.WouldBlock`, which changes nothing
        and is retried), the places are freed: only this put's commit or abort ever frees
        them."""
        self.put.read_trailer(self._trailer)
        try:
            result: PutResult = self.store.commit_write(
                self.ns, self.hashes, owner=self.owner, nowait=nowait, sums=self.put.sums,
                landed=self._landing.sums())
        except WouldBlock:
            raise
        except Exception:
            with contextlib.suppress(Exception):  # a closing store frees them itself
                self.abort()
            raise
        self.done = True
        return result

    def abort(self) -> None:
        """Free the places of a frame that will never complete; idempotent."""
        if not self.done:
            self.done = True
            self.store.abort_write(self.ns, self.hashes, owner=self.owner)

    def release_scratch(self) -> None:
        if self._scratch is not None:
            self._buffers.give(self._scratch)
            self._scratch = None


def begin(ops: Any, session: Any, header_bytes: bytes, payload_len: int) -> DirectPut | None:
    """A :class:`DirectPut` for this frame, or None to receive it the usual way."""
    store = ops.store
    if not ops.shm_ops.enabled or session.principal is None:
        return None
    try:
        header = decode_header(header_bytes)
        if header.get("op") != Put.op or header.get("noreply"):
            return None
        put = Put.from_header(header, Limits(ops.settings.max_batch, payload_len))
        ns = ops.ctx.ns(session, put.ns)
    except Exception:  # FrameError, unknown namespace...: the usual path answers with it
        return None
    hashes = put.hashes
    if put.durable or not hashes or any(s != ns.block_bytes for s in put.sizes) \
            or len(set(hashes)) != len(hashes):
        return None
    # The payload lands in the places until the frame completes or times out: a reservation
    # that ran out sooner could give its slots to another block, stored and acknowledged,
    # under the rest of the payload.
    lease_s = transfer_lease_s(ops.settings.frame_timeout_s, ops.settings.max_lease_s)
    if lease_s is None:
        return None
    owner = f"{RECV_OWNER}{next(_ids)}"
    try:
        extents = store.reserve_write(ns.name, hashes, lease_s=lease_s, owner=owner,
                                      nowait=True, receiving=True).extents
    except Exception:  # WouldBlock, no room: the usual path
        return None
    host = store.tier("host")
    scratch = ops.buffers.take(ns.block_bytes) if None in extents else None
    places: list[Extent | None] = []  # None: stored already (or another writer's), dropped
    for ext in extents:
        if ext is None:
            places.append(None)
        else:
            places += ext
    targets = [host.view(*place) if place is not None
               else memoryview(cast(bytearray, scratch))[: ns.block_bytes]
               for place in coalesce(places)]
    blocks = [None if ext is None else [host.view(off, n) for off, n in ext] for ext in extents]
    return DirectPut(store, ns.name, put, owner, targets, scratch, ops.buffers, blocks)
