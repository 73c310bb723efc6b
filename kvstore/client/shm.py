"""Client side of the shared-memory path: map the server's host slab and copy block bytes in
and out at the extents the server hands out (one memcpy per extent, no socket).

A process maps each server instance's slab once, however many clients it opens: mappings are
shared and reference-counted (keyed by the server's instance id, since a restarted server
reuses the segment name for a new segment).

Fencing: extents come with their block's generation. :meth:`SlabMapping.write` checks it
before copying in and the reads check it after copying out, against the generation words the
server keeps in the same segment (see :mod:`kvstore.tiers.slots`); a moved number raises
:class:`~kvstore.client.errors.StaleExtentsError`: the copy was late, its slots belong to
another block now.

Checksums: a write returns the checksum of the block it copied in (the commit sends it, and
the server refuses a block whose bytes in the slab differ); a checked read hashes its copy
and compares with the block's recorded checksum, so that bytes changed in the slab after the
commit (a late writer that passed its generation check before stalling) are a miss."""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from kvstore.checksum import checksum, copy_summed
from kvstore.client.errors import BlockSizeError, KVStoreClientError, StaleExtentsError
from kvstore.protocol.frame import Buffer
from kvstore.tiers.segment import attach_slab, map_shared

if TYPE_CHECKING:
    from kvstore.tiers.segment import Segment

Extents = Sequence[Sequence[int]]  # [(offset, length), ...] of one block
_SHARED: dict[tuple[str, str], SlabMapping] = {}
_LOCK = threading.Lock()


class SlabMapping:
    """The server's host slab, mapped read-write into this process."""

    def __init__(self, name: str, size: int, slot_bytes: int = 0,
                 gen_offset: int | None = None, fd: int | None = None) -> None:
        need = size if gen_offset is None else gen_offset + 8 * (size // max(slot_bytes, 1))
        if fd is not None:  # a memfd received from the server (shm_fd): map it, no name
            if os.fstat(fd).st_size < need:
                raise OSError(f"the slab descriptor holds {os.fstat(fd).st_size} bytes, "
                              f"expected {need}")
            self._shm: mmap.mmap | Segment = map_shared(fd, need, populate=True)
            self.buf: memoryview = memoryview(self._shm)
        else:
            # never unlinks it, not even when this process exits
            self._shm = attach_slab(name, populate=True)
            if self._shm.size < need:
                self._shm.close()
                raise OSError(f"shared memory {name} is {self._shm.size} bytes, expected {need}")
            self.buf = self._shm.buf
        self.name = name
        self.slot_bytes = slot_bytes
        # the server's generation word of each slot (read-only here); None: no fencing
        self.gens: np.ndarray | None = None if gen_offset is None or not slot_bytes else \
            np.frombuffer(self.buf, np.uint64, size // slot_bytes, gen_offset)
        self._refs = 1
        self._key: tuple[str, str] | None = None

    def current(self, extents: Extents, gen: int | None) -> bool:
        """Whether the block at ``extents`` still has generation ``gen`` (True when either
        side knows no generation)."""
        gens = self.gens
        if gens is None or gen is None or not extents:
            return True
        return int(gens[int(extents[0][0]) // self.slot_bytes]) == gen

    def verify(self, extents: Extents, gen: int | None) -> None:
        """Raise :class:`StaleExtentsError` unless :meth:`current`."""
        if not self.current(extents, gen):
            raise StaleExtentsError(
                f"extents at {extents[0][0]} were freed since generation {gen} was handed out "
                "(the lease ran out)", "stale_extents")

    def write(self, extents: Extents, block: Buffer, gen: int | None = None) -> int:
        """Copy ``block`` into the slab at ``extents`` (which must add up to its size) and
        return the checksum of ``block`` (hashed a chunk at a time as it is copied, from the
        source: what lands in the slab may be overwritten by a late writer, the commit
        compares). With ``gen``, first check the slots are still that generation
        (:class:`StaleExtentsError` if not, nothing written)."""
        self.verify(extents, gen)
        src = memoryview(block).cast("B")
        want = sum(length for _, length in extents)
        if want != src.nbytes:
            raise BlockSizeError(f"block of {src.nbytes} bytes does not match its namespace, "
                                 f"whose blocks are {want} bytes", "block_size")
        h = xxhash.xxh3_64()
        pos = 0
        for off, length in extents:
            copy_summed(self.buf[off:off + length], src[pos:pos + length], h, of_src=True)
            pos += length
        return h.intdigest()

    def read(self, extents: Extents, gen: int | None = None) -> bytes:
        """The block's bytes as a new ``bytes`` (one copy); with ``gen``, checked after the
        copy (:class:`StaleExtentsError`: they are not that block's)."""
        if len(extents) == 1:
            off, length = extents[0]
            out = bytes(self.buf[off:off + length])
        else:
            out = b"".join(self.buf[off:off + length] for off, length in extents)
        self.verify(extents, gen)
        return out

    def read_summed(self, extents: Extents, gen: int | None = None) -> tuple[bytes, int]:
        """:meth:`read` and the checksum of the bytes copied (of the copy, which no other
        process can change)."""
        out = self.read(extents, gen)
        return out, checksum(out)

    def read_into_summed(self, extents: Extents, dest: Buffer,
                         gen: int | None = None) -> tuple[int, int]:
        """:meth:`read_into` and the checksum of the bytes copied, each chunk hashed in
        ``dest`` right after it is copied (still in cache)."""
        out = _room(dest, extents)
        h = xxhash.xxh3_64()
        pos = 0
        for off, length in extents:
            copy_summed(out[pos:pos + length], self.buf[off:off + length], h)
            pos += length
        self.verify(extents, gen)
        return pos, h.intdigest()

    def read_into(self, extents: Extents, dest: Buffer, gen: int | None = None) -> int:
        """Copy the block into ``dest`` (writable, large enough); returns bytes copied. With
        ``gen``, checked after the copy (:class:`StaleExtentsError`)."""
        out = _room(dest, extents)
        pos = 0
        for off, length in extents:
            out[pos:pos + length] = self.buf[off:off + length]
            pos += length
        self.verify(extents, gen)
        return pos

    def close(self) -> None:
        """Drop this reference; the last one unmaps."""
        with _LOCK:
            self._refs -= 1
            if self._refs > 0:
                return
            if self._key is not None and _SHARED.get(self._key) is self:
                del _SHARED[self._key]
        self.gens = None
        if isinstance(self._shm, mmap.mmap):
            with contextlib.suppress(BufferError):
                self.buf.release()
        with contextlib.suppress(BufferError):  # a view still held: the OS unmaps at exit
            self._shm.close()


def _room(dest: Buffer, extents: Extents) -> memoryview:
    """``dest`` as flat bytes, refused (:class:`BlockSizeError`) where the block is larger."""
    out = memoryview(dest).cast("B")
    need = sum(length for _, length in extents)
    if out.nbytes < need:
        raise BlockSizeError(f"a buffer of {out.nbytes} bytes cannot take a block of {need}",
                             "block_size")
    return out


def write_fenced(slab: SlabMapping, extents: Extents, block: Buffer, gen: int | None) -> int:
    """``slab.write``, fenced by ``gen`` when the server gave one (an older server gives
    none: a plain copy, as before generations); the block's checksum."""
    return slab.write(extents, block) if gen is None else slab.write(extents, block, gen)


def read_fenced(slab: SlabMapping, extents: Extents, gen: int | None) -> bytes:
    """``slab.read``, checked against ``gen`` when the server gave one."""
    return slab.read(extents) if gen is None else slab.read(extents, gen)


def read_into_fenced(slab: SlabMapping, extents: Extents, dest: Buffer, gen: int | None) -> int:
    """``slab.read_into``, checked against ``gen`` when the server gave one."""
    return slab.read_into(extents, dest) if gen is None else slab.read_into(extents, dest, gen)


def read_checked(slab: SlabMapping, extents: Extents, gen: int | None,
                 csum: int | None) -> tuple[bytes, bool]:
    """``read_fenced``, and whether the copy hashes to ``csum`` (the block's recorded
    checksum; None from a server that sends none: not checked, True)."""
    if csum is None:
        return read_fenced(slab, extents, gen), True
    out, got = slab.read_summed(extents, gen)
    return out, got == csum


def read_into_checked(slab: SlabMapping, extents: Extents, dest: Buffer, gen: int | None,
                      csum: int | None) -> tuple[bool, bool]:
    """``read_into_fenced`` (whether it copied), and whether the copy hashes to ``csum``."""
    if csum is None:
        return read_into_fenced(slab, extents, dest, gen) > 0, True
    n, got = slab.read_into_summed(extents, dest, gen)
    return n > 0, got == csum


def try_map(name: str, size: int, instance: str = "", slot_bytes: int = 0,
            gen_offset: int | None = None) -> SlabMapping | None:
    """A reference to the mapping of ``name`` for server ``instance``, or None if this
    process cannot open it (other host, other container, other user)."""
    key = (name, instance)
    with _LOCK:
        shared = _SHARED.get(key)
        if shared is not None:
            shared._refs += 1
            return shared
        try:
            mapping = SlabMapping(name, size, slot_bytes, gen_offset)
        except (OSError, ValueError):
            return None
        mapping._key = key
        _SHARED[key] = mapping
        return mapping


def receive_map(path: str, token: str | None, timeout: float,
                instance: str) -> SlabMapping:
    """A reference to the mapping of server ``instance``'s memfd slab, which the server hands
    over its Unix socket ``path`` to an authenticated, trusted client (raises its refusal).
    Asked for even when this process maps the slab already: each client must be entitled."""
    from kvstore.client.shm_fd import receive_slab

    fd, layout = receive_slab(path, token, timeout)
    key = ("", instance)
    try:
        with _LOCK:
            shared = _SHARED.get(key)
            if shared is not None:
                shared._refs += 1
                return shared
            mapping = SlabMapping("", layout.size, layout.slot_bytes, layout.gen_offset, fd)
            mapping._key = key
            _SHARED[key] = mapping
            return mapping
    finally:
        os.close(fd)  # the mapping keeps the memory; the descriptor is not needed


def remap(old: SlabMapping | None, info: Any, use_shm: bool | None, url: str,
          token: str | None = None, timeout: float = 10.0) -> SlabMapping | None:
    """The slab mapping for freshly discovered server ``info`` (both clients, after a
    (re)connect): drop ``old``, map the new slab unless ``use_shm`` is False (by name, or a
    memfd received over the Unix socket), and raise if ``use_shm`` is True and the slab
    cannot be mapped from this process (or the server refuses it to this client)."""
    if old is not None:
        old.close()
    slab = None
    why = "cannot be mapped from this process"
    if use_shm is not False and info.shm_name:
        slab = try_map(info.shm_name, info.shm_size, info.instance, info.shm_slot_bytes,
                       info.shm_gen_offset)
    elif use_shm is not False and info.shm_offered and isinstance(info.target, str):
        try:
            slab = receive_map(info.target, token, timeout, info.instance)
        except (OSError, ValueError, KVStoreClientError) as exc:  # refused: use the socket
            why = f"was refused: {exc}"
    if use_shm and slab is None:
        raise KVStoreClientError(f"use_shm=True but the slab of {url} {why}", "shm")
    return slab
