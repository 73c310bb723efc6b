"""Client side of the shared-memory path: map the server's host slab and copy block bytes in
and out at the extents the server hands out (one memcpy per extent, no socket).

A process maps each server instance's slab once, however many clients it opens: mappings are
shared and reference-counted (keyed by the server's instance id, since a restarted server
reuses the segment name for a new segment)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from kvstore.client.errors import BlockSizeError, KVStoreClientError
from kvstore.protocol.frame import Buffer

Extents = Sequence[Sequence[int]]  # [(offset, length), ...] of one block
_SHARED: dict[tuple[str, str], SlabMapping] = {}
_LOCK = threading.Lock()


class SlabMapping:
    """The server's host slab, mapped read-write into this process."""

    def __init__(self, name: str, size: int) -> None:
        from kvstore.tiers.host import attach_slab  # untracked: exiting never unlinks it

        self._shm: Any = attach_slab(name)
        if self._shm.size < size:
            self._shm.close()
            raise OSError(f"shared memory {name} is {self._shm.size} bytes, expected {size}")
        self.name = name
        buf = self._shm.buf
        assert buf is not None
        self.buf: memoryview = buf
        self._refs = 1
        self._key: tuple[str, str] | None = None

    def write(self, extents: Extents, block: Buffer) -> None:
        """Copy ``block`` into the slab at ``extents`` (which must add up to its size)."""
        src = memoryview(block).cast("B")
        want = sum(length for _, length in extents)
        if want != src.nbytes:
            raise BlockSizeError(f"block of {src.nbytes} bytes does not match its namespace, "
                                 f"whose blocks are {want} bytes", "block_size")
        pos = 0
        for off, length in extents:
            self.buf[off:off + length] = src[pos:pos + length]
            pos += length

    def read(self, extents: Extents) -> bytes:
        """The block's bytes as a new ``bytes`` (one copy)."""
        if len(extents) == 1:
            off, length = extents[0]
            return bytes(self.buf[off:off + length])
        return b"".join(self.buf[off:off + length] for off, length in extents)

    def read_into(self, extents: Extents, dest: Buffer) -> int:
        """Copy the block into ``dest`` (writable, large enough); returns bytes copied."""
        out = memoryview(dest).cast("B")
        pos = 0
        for off, length in extents:
            out[pos:pos + length] = self.buf[off:off + length]
            pos += length
        return pos

    def close(self) -> None:
        """Drop this reference; the last one unmaps."""
        with _LOCK:
            self._refs -= 1
            if self._refs > 0:
                return
            if self._key is not None and _SHARED.get(self._key) is self:
                del _SHARED[self._key]
        with contextlib.suppress(BufferError):  # a view still held: the OS unmaps at exit
            self._shm.close()


def try_map(name: str, size: int, instance: str = "") -> SlabMapping | None:
    """A reference to the mapping of ``name`` for server ``instance``, or None if this
    process cannot open it (other host, other container, other user)."""
    key = (name, instance)
    with _LOCK:
        shared = _SHARED.get(key)
        if shared is not None:
            shared._refs += 1
            return shared
        try:
            mapping = SlabMapping(name, size)
        except (OSError, ValueError):
            return None
        mapping._key = key
        _SHARED[key] = mapping
        return mapping


def remap(old: SlabMapping | None, info: Any, use_shm: bool | None, url: str) -> SlabMapping | None:
    """The slab mapping for freshly discovered server ``info`` (both clients, after a
    (re)connect): drop ``old``, map the new slab unless ``use_shm`` is False, and raise if
    ``use_shm`` is True and the slab cannot be mapped from this process."""
    if old is not None:
        old.close()
    slab = None
    if use_shm is not False and info.shm_name:
        slab = try_map(info.shm_name, info.shm_size, info.instance)
    if use_shm and slab is None:
        raise KVStoreClientError(
            f"use_shm=True but the slab of {url} cannot be mapped from this process", "shm"
        )
    return slab
