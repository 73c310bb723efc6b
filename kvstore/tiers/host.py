"""Host RAM tier: a slot slab in named POSIX shared memory.

The slab is a ``multiprocessing.shared_memory.SharedMemory`` segment so that a client on the
same machine maps it by name (:func:`attach_slab`) and reads or writes blocks at the extents
the store hands out, with no copy through a socket. When CUDA is present the mapping is
page-locked (``cudaHostRegister``) so host-to-device copies from it run at full DMA speed.

Lifetime: the tier creates the segment and unlinks it on :meth:`HostTier.close` (or, if never
closed, when the tier is collected or the interpreter exits). Python 3.11's resource tracker
registers every segment a process creates *or attaches* and unlinks it when that process exits,
which would let an exiting client destroy the server's slab, and it warns about "leaked"
segments the tier unlinks on its own schedule; so both sides unregister right after opening
and the tier alone unlinks.
"""

from __future__ import annotations

import _posixshmem
import contextlib
import logging
import mmap
import os
import secrets
import sys
import weakref
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from kvstore.config import DEFAULT_SLOT_BYTES
from kvstore.errors import CapacityError
from kvstore.tiers.base import Buffer
from kvstore.tiers.slab import Extents, SlabInfo, SlabTier

log = logging.getLogger(__name__)


def _open_untracked(name: str, create: bool, size: int = 0) -> SharedMemory:
    shm = SharedMemory(name=name, create=create, size=size)
    # SharedMemory prefixes a "/" on POSIX; the tracker knows the segment by that name.
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def _commit_memory(shm: SharedMemory) -> None:
    """Back the whole segment with memory now. A tmpfs segment is sparse: without this, a
    /dev/shm too small for the capacity surfaces as SIGBUS on some later write (a crash, not
    an error), and every first write to a page pays a page fault on the hot path."""
    try:
        os.posix_fallocate(shm._fd, 0, shm.size)  # type: ignore[attr-defined]
    except OSError as exc:
        name = shm.name
        _release(shm, None)
        raise CapacityError(
            f"host tier: cannot reserve {shm.size} bytes of shared memory for {name} "
            f"({exc.strerror}); lower the host capacity or enlarge /dev/shm"
        ) from exc
    pages = np.frombuffer(shm.buf, np.uint8)  # type: ignore[arg-type]
    pages[:: mmap.PAGESIZE] = 0  # fault every page in once, at start
    del pages


def attach_slab(shm_name: str) -> SharedMemory:
    """Map a host tier's slab from another process (name from ``SlabInfo.shm_name``).

    Read and write ``shm.buf`` at the extents the store returns; call ``shm.close()`` when
    done and never ``unlink()``: the segment belongs to the tier."""
    return _open_untracked(shm_name, create=False)


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


def _release(shm: SharedMemory, pinned: int | None) -> None:
    if pinned is not None:
        import torch

        torch.cuda.cudart().cudaHostUnregister(pinned)
    try:
        shm.close()
    except BufferError:
        # A caller still holds a view(); the mapping goes when the last view does (mmap
        # unmaps on dealloc). Drop SharedMemory's handle on it, or its __del__ would try to
        # close it again and print the same BufferError at collection. The name goes now.
        log.debug("host tier: slab %s still has exported views at close", shm.name)
        shm._mmap = None  # type: ignore[attr-defined]
        os.close(shm._fd)  # type: ignore[attr-defined]
        shm._fd = -1  # type: ignore[attr-defined]
    # Not shm.unlink(): it would unregister from the tracker a second time, and the tracker
    # process prints a traceback for a name it does not know.
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink(shm._name)  # type: ignore[attr-defined]


class HostTier(SlabTier):
    """Host RAM slot slab in shared memory (options: ``slot_bytes``, ``shm_name``, ``pin``)."""

    name = "host"

    def __init__(
        self,
        capacity_bytes: int,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        shm_name: str | None = None,
        pin: bool = True,
    ) -> None:
        super().__init__(capacity_bytes, slot_bytes)
        self._shm = _open_untracked(
            shm_name or f"kvstore-{os.getpid()}-{secrets.token_hex(4)}",
            create=True,
            size=self.slab_bytes,
        )
        _commit_memory(self._shm)
        buf = self._shm.buf
        if buf is None:  # typeshed allows it; a segment just created and mapped has a buffer
            raise RuntimeError(f"host tier: shared memory {self._shm.name} is not mapped")
        self._buf: memoryview | None = buf
        self.pinned = _cuda_register(np.frombuffer(buf, np.uint8)) if pin else None
        self._finalizer = weakref.finalize(self, _release, self._shm, self.pinned)

    @property
    def shm_name(self) -> str:
        return self._shm.name

    def slab_info(self) -> SlabInfo:
        return SlabInfo(self._shm.name, self.slab_bytes, self.slot_bytes)

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

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._index.clear()
            self._reserved.clear()
            # Our own export of the mapping must go before SharedMemory.close() can unmap it.
            self._buf = None
        self._finalizer()
