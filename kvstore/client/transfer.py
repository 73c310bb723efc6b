"""Block puts and gets as steps (see :mod:`kvstore.client.exchange`), over the socket or
through the server's shared slab; both faces run them.

A local put goes through staged places in one round trip (``shm_put``), or, when the server
would not stage enough, reserves places, copies, and commits (two round trips); a durable
put, or one without the slab, sends the bytes in ``put`` frames. A local get pins the blocks
(``shm_acquire``), copies them out and releases the pins without waiting for a reply; when
the host tier is full of pinned blocks it falls back to ``get`` frames.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from kvstore.checksum import checksums
from kvstore.client.discovery import Route
from kvstore.client.errors import (
    BadRequestError,
    CapacityError,
    StaleExtentsError,
    StaleStagingError,
)
from kvstore.client.exchange import Call, Link, Steps
from kvstore.client.landed import landings
from kvstore.client.plan import batches, frame_batch, get_batch, merge_put, slab_room
from kvstore.client.shm import SlabMapping, read_checked, read_into_checked, write_fenced
from kvstore.client.staging import StagedPlaces
from kvstore.protocol import (
    Buffer,
    Check,
    ExtentsReply,
    Get,
    GetReply,
    Put,
    PutReply,
    ShmAbort,
    ShmAcquire,
    ShmCheck,
    ShmCommit,
    ShmPut,
    ShmPutReply,
    ShmRelease,
    ShmReserve,
    ShmStage,
    StageReply,
    first_offsets,
)
from kvstore.types import BlockHash, PutResult

TRAILER_PROTOCOL = 2  # the first protocol in which a put may send its checksums last


def check_put(hashes: Sequence[BlockHash], blocks: Sequence[Buffer]) -> None:
    """Refuse a put whose hashes and blocks do not pair up, before anything is sent."""
    if len(hashes) != len(blocks):
        raise ValueError(f"{len(hashes)} hashes but {len(blocks)} blocks")


def sent_summed(info: Route, ns: str, hs: list[BlockHash], sizes: list[int], durable: bool,
                bs: Sequence[Buffer]) -> Put:
    """A put frame that carries its blocks' checksums: after the blocks (hashed as they are
    sent, :mod:`kvstore.client.summed`) where the server speaks protocol 2, else in the
    header (one pass over the blocks before the first byte moves)."""
    if info.protocol >= TRAILER_PROTOCOL:
        return Put(ns, hs, sizes, durable, trailer=True)
    return Put(ns, hs, sizes, durable, [*checksums(bs)])


def fencing(gens: list[int | None]) -> list[int | None] | None:
    """The generations to send back with a commit; None (no check, the frame of a client
    before generations) when the server gave none."""
    return gens if any(g is not None for g in gens) else None


class Transfers:
    """Plans puts and gets. Owns the staged places of this client and the block size it has
    seen per namespace (which sizes shared-memory get batches)."""

    def __init__(self) -> None:
        self.staged = StagedPlaces()
        self.block_bytes: dict[str, int] = {}

    # -- puts -----------------------------------------------------------------------------
    def put(self, link: Link, ns: str, hashes: Sequence[BlockHash], blocks: Sequence[Buffer],
            durable: bool) -> Steps[PutResult]:
        """What the put did (stored, existing, refused), over every batch."""
        hashes = list(hashes)
        slab = None if durable else link.slab
        sizes = [memoryview(b).nbytes for b in blocks]
        results: list[PutReply | ShmPutReply] = []
        room = slab_room(link.info) if slab is not None else None
        for lo, hi in batches(sizes, link.info, max_bytes=room):
            hs, bs = hashes[lo:hi], blocks[lo:hi]
            if slab is None:  # the server refuses a block whose bytes arrive otherwise
                header, _ = yield Call(sent_summed(link.info, ns, hs, sizes[lo:hi], durable,
                                                   bs), bs)
                results.append(PutReply.from_header(header))
                continue
            done: PutReply | ShmPutReply | None
            done = yield from self._put_staged(link.info.instance, slab, ns, hs, bs)
            if done is None:
                done = yield from self._put_reserved(slab, ns, hs, bs)
            results.append(done)
        return merge_put(results)

    def _put_staged(self, instance: str, slab: SlabMapping, ns: str, hs: list[BlockHash],
                    bs: Sequence[Buffer]) -> Steps[ShmPutReply | None]:
        """One batch through staged places in one round trip (kvstore.store.staging); None if
        the server could not stage enough places (the caller reserves and commits)."""
        places = self.staged.pooled(instance, ns, len(hs))
        if places is None:
            return None
        if len(places) < len(hs):
            try:
                header, _ = yield Call(ShmStage(ns, len(hs) - len(places)))
            except BaseException:
                self.staged.give_back(instance, ns, places)
                raise
            stage = StageReply.from_header(header)
            self.staged.record(stage.staged, stage.gens)
            places += stage.staged
        places = self.staged.enough(instance, ns, len(hs), places)
        if places is None:
            return None
        try:
            sums = self.staged.fill(slab, instance, ns, places, bs)
        except StaleExtentsError:  # the server dropped our places (and maybe reused them)
            self.staged.forget(ns)
            return None
        gens = fencing([self.staged.gen(p) for p in places])
        try:
            header, _ = yield Call(ShmPut(ns, hs, first_offsets(places), gens, sums))
        except StaleStagingError:  # the server dropped them: nothing was stored
            self.staged.forget(ns)
            return None
        # on any other failure (no reply, a cancelled task) the places are dropped (see
        # StagedPlaces.settle)
        reply = ShmPutReply.from_header(header)
        self.staged.settle(instance, ns, places, reply.used, reply.staged, reply.gens)
        return reply

    def _put_reserved(self, slab: SlabMapping, ns: str, hs: list[BlockHash],
                      bs: Sequence[Buffer]) -> Steps[PutReply]:
        header, _ = yield Call(ShmReserve(ns, hs))
        reserved = ExtentsReply.from_header(header)
        sums: list[int | None] = [None] * len(hs)
        try:
            for i, (ext, gen, block) in enumerate(zip(reserved.extents, reserved.gens, bs,
                                                      strict=False)):
                if ext is not None:  # None: stored already
                    with contextlib.suppress(StaleExtentsError):  # late: the commit refuses it
                        sums[i] = write_fenced(slab, ext, block, gen)
        except BaseException:
            yield Call(ShmAbort(ns, hs))
            raise
        header, _ = yield Call(ShmCommit(ns, hs, fencing(reserved.gens), sums))
        return PutReply.from_header(header)

    # -- gets -----------------------------------------------------------------------------
    def get(self, link: Link, ns: str, hashes: Sequence[BlockHash],
            into: Sequence[Buffer] | None, summed: bool = False) -> Steps[list[Any]]:
        """Each block's bytes or None; with ``into``, whether it was copied into its
        buffer, or with ``summed`` too, its :class:`Landed` (None for a miss)."""
        hashes = list(hashes)
        out: list[Any] = []
        lo = 0
        cap = len(hashes)  # halved when the server finds a reply too large for a frame
        while lo < len(hashes):
            step = min(cap, frame_batch(link.info, self.block_bytes.get(ns)))
            if link.slab is not None:
                step = min(step, get_batch(link.info, self.block_bytes.get(ns)))
            hi = min(len(hashes), lo + step)
            hs, dest = hashes[lo:hi], None if into is None else into[lo:hi]
            part = None
            if link.slab is not None:
                part = yield from self._get_mapped(link.slab, ns, hs, dest, summed)
            if part is None:  # no slab, or the host tier is full of pinned blocks
                try:
                    header, part = yield Call(Get(ns, hs, checked=True), into=dest)
                except BadRequestError as exc:  # blocks larger than guessed
                    if exc.code != "too_large" or len(hs) == 1:
                        raise
                    cap = len(hs) // 2
                    continue
                # the connection checked each block as it landed; a miss where one was sent
                # failed: the server hashes its copy and drops the block if it is bad
                reply = GetReply.from_header(header)
                bad = reply.bad(part)
                if bad:
                    yield Call(Check(ns, [hs[i] for i in bad]), noreply=True)
                if summed:
                    part = landings(part, reply.sums)
                for block in part:  # learn the block size: later batches fit the frame
                    if isinstance(block, bytes | bytearray | memoryview):
                        self.block_bytes[ns] = memoryview(block).nbytes
                        break
            out += part
            lo = hi
        return out

    def _get_mapped(self, slab: SlabMapping, ns: str, hs: list[BlockHash],
                    dest: Sequence[Buffer] | None, summed: bool = False
                    ) -> Steps[list[Any] | None]:
        """One batch copied out of the slab; None if the host tier could not pin it."""
        try:
            header, _ = yield Call(ShmAcquire(ns, hs))
        except CapacityError:
            return None
        out: list[Any] = []
        acquired = ExtentsReply.from_header(header)
        bad: list[BlockHash] = []
        try:
            for i, (ext, gen, csum) in enumerate(zip(acquired.extents, acquired.gens,
                                                     acquired.sums, strict=True)):
                if ext is None:
                    out.append(None if dest is None else False)
                    continue
                self.block_bytes[ns] = sum(n for _, n in ext)
                try:
                    got, ok = read_checked(slab, ext, gen, csum) if dest is None \
                        else read_into_checked(slab, ext, dest[i], gen, csum)
                except StaleExtentsError:  # copied too late: another block's bytes, a miss
                    got, ok = None, True
                if not ok:  # the slab's bytes are not the block's: a miss, and say so
                    got = None
                    bad.append(hs[i])
                out.append(got if got is not None else (None if dest is None else False))
        finally:  # no reply needed: the pins go with the lease if this frame is lost
            yield Call(ShmRelease(ns, hs), noreply=True)
        if bad:  # our copy failed its checksum: the server hashes its own and drops it
            yield Call(ShmCheck(ns, bad), noreply=True)
        return landings(out, acquired.sums) if summed else out
