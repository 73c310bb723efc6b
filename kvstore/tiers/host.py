"""Host RAM tier: a slot slab in shared memory (an anonymous memfd, or a named segment).

The slab is a shared segment (:mod:`kvstore.tiers.segment`) so that a client on the same
machine maps it and reads or writes blocks at the extents the store hands out, with no copy
through a socket. With ``memfd=True`` (what ``kvstore serve`` uses) the segment has no name:
a client gets its file descriptor only from the server, after authenticating
(:meth:`HostTier.share`). Without it the segment is named and any process of the same user
maps it by name (:func:`attach_slab`). When CUDA is present the mapping is page-locked
(``cudaHostRegister``) so host-to-device copies from it run at full DMA speed.

After the slab the segment holds one ``uint64`` generation per slot (at
:attr:`HostTier.gen_offset`), bumped each time the slot is freed (see
:mod:`kvstore.tiers.slots`): a client checks a block's number after copying it out (or before
copying in) and so never takes another block's bytes for the one it asked for.

Lifetime: the tier creates the segment and unlinks it on :meth:`HostTier.close` (or, if never
closed, when the tier is collected or the interpreter exits).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import weakref
from collections.abc import Sequence

import numpy as np

from kvstore.checksum import checksum_parts
from kvstore.config import DEFAULT_SLOT_BYTES
from kvstore.tiers.base import Buffer
from kvstore.tiers.segment import Segment, attach_slab
from kvstore.tiers.slab import Extents, SlabInfo, SlabShare, SlabTier
from kvstore.tiers.slots import Entry

__all__ = ["HostTier", "attach_slab"]

log = logging.getLogger(__name__)


def _cuda_register(arr: np.ndarray) -> int | None:
    """Page-lock ``arr`` for CUDA; its address on success, None without CUDA or on failure."""
    if "torch" not in sys.modules and not os.path.exists("/dev/nvidiactl"):
        return None  # no NVIDIA driver: do not pay a torch import to learn there is no CUDA
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    ptr = int(arr.ctypes.data)
    try:
        torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(ptr, arr.nbytes, 0))
    except Exception as exc:  # pinning is an optimisation: serve unpinned rather than fail
        log.warning("host tier: cudaHostRegister of %d bytes failed: %s", arr.nbytes, exc)
        return None
    return ptr


def _release(seg: Segment, pinned: int | None) -> None:
    if pinned is not None:
        import torch

        torch.cuda.cudart().cudaHostUnregister(pinned)
    seg.close()


class HostTier(SlabTier):
    """Host RAM slot slab in shared memory (options: ``slot_bytes``, ``shm_name``, ``pin``,
    ``memfd``: no name at all, ``shm_name`` is then ignored)."""

    name = "host"

    def __init__(
        self,
        capacity_bytes: int,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        shm_name: str | None = None,
        pin: bool = True,
        memfd: bool = False,
    ) -> None:
        super().__init__(capacity_bytes, slot_bytes)
        self.gen_offset = -(-self.slab_bytes // 64) * 64
        name = None if memfd else shm_name or f"kvstore-{os.getpid()}-{secrets.token_hex(4)}"
        self._seg = Segment.create(self.gen_offset + 8 * self.num_slots, name)
        buf = self._seg.buf
        self._buf: memoryview | None = buf
        # a fresh allocator has freed nothing: its generations (all 0) move into the segment
        self._slots.gens = np.frombuffer(buf, np.uint64, self.num_slots, self.gen_offset)
        self.pinned = _cuda_register(np.frombuffer(buf, np.uint8)) if pin else None
        self._finalizer = weakref.finalize(self, _release, self._seg, self.pinned)

    @property
    def shm_name(self) -> str | None:
        """The segment's name, or None for a memfd."""
        return self._seg.name

    def slab_info(self) -> SlabInfo:
        return SlabInfo(self._seg.name, self.slab_bytes, self.slot_bytes)

    def share(self) -> SlabShare:
        """The segment's file descriptor (owned by the tier: send it, do not close it), and
        where the slab and the generations lie in it."""
        return SlabShare(self._seg.fd, self.slab_bytes, self.slot_bytes, self.gen_offset)

    def view(self, offset: int, length: int) -> memoryview:
        """A writable view of the slab (no copy); valid until :meth:`close`."""
        if offset < 0 or length < 0 or offset + length > self.slab_bytes:
            raise ValueError(f"extent ({offset}, {length}) outside slab of {self.slab_bytes}")
        return self._live()[offset : offset + length]

    def _live(self) -> memoryview:
        if self._buf is None:
            raise RuntimeError("host tier is closed")
        return self._buf

    def _copy_in(self, extents: Extents, data: Buffer) -> None:
        # memoryview slice assignment is a bare memcpy; numpy slicing costs a few microseconds
        # per call, which shows at 64 KiB blocks.
        buf = self._live()
        if len(extents) == 1:
            off, length = extents[0]
            buf[off : off + length] = data
            return
        src, pos = memoryview(data), 0  # slices of a view, not of bytes: no copies
        for off, length in extents:
            buf[off : off + length] = src[pos : pos + length]
            pos += length

    def _copy_in_many(self, extents: list[Extents], datas: list[Buffer]) -> None:
        buf = self._live()
        for ext, data in zip(extents, datas, strict=True):
            if len(ext) == 1:  # inline the common case: a call per block shows at 64 KiB
                off, length = ext[0]
                buf[off : off + length] = data
            else:
                self._copy_in(ext, data)

    def _copy_out(self, extents: Extents, size: int) -> bytes:
        buf = self._live()
        if len(extents) == 1:
            off, length = extents[0]
            return buf[off : off + length].tobytes()
        return b"".join([buf[off : off + length] for off, length in extents])

    def sums(self, extents: Sequence[Extents]) -> list[int]:
        buf = self._live()  # hashed where they lie: no copy
        return [checksum_parts([buf[off:off + n] for off, n in ext]) for ext in extents]

    def _copy_out_many(self, entries: Sequence[Entry | None]) -> list[bytes | None]:
        copy = self._copy_out
        return [None if e is None else copy(e[1], e[0]) for e in entries]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._index.clear()
            self._reserved.clear()
            # Our own export of the mapping must go before the segment can unmap it.
            self._buf = None
            self._slots.gens = self._slots.gens.copy()
        self._finalizer()
