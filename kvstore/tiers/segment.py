"""Shared memory segments of the host tier: a named POSIX segment, or an anonymous memfd.

A **memfd** (``memfd_create``) has no name in ``/dev/shm``: no other process can open it unless
it is handed the file descriptor (the server sends it over its authenticated Unix socket with
``SCM_RIGHTS``) or may inspect this process (same user with ptrace rights via ``/proc/<pid>/fd``,
or root). A **named** segment is what :mod:`multiprocessing.shared_memory` makes: any process of
the same user can map it by name (:func:`attach_slab`); kept for library use and tests.

Python 3.11's resource tracker registers every named segment a process creates *or attaches*
and unlinks it when that process exits, which would let an exiting client destroy the server's
slab, and it warns about "leaked" segments the tier unlinks on its own schedule; so both sides
unregister right after opening and the tier alone unlinks.
"""

from __future__ import annotations

import _posixshmem
import contextlib
import logging
import mmap
import os
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import numpy as np

from kvstore.errors import CapacityError

log = logging.getLogger(__name__)


def _open_untracked(name: str, create: bool, size: int = 0) -> SharedMemory:
    shm = SharedMemory(name=name, create=create, size=size)
    # SharedMemory prefixes a "/" on POSIX; the tracker knows the segment by that name.
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def attach_slab(shm_name: str) -> SharedMemory:
    """Map a named host tier slab from another process (name from ``SlabInfo.shm_name``).

    Read and write ``shm.buf`` at the extents the store returns; call ``shm.close()`` when
    done and never ``unlink()``: the segment belongs to the tier."""
    return _open_untracked(shm_name, create=False)


def memory_available() -> int | None:
    """Bytes of memory this process may still take: the kernel's ``MemAvailable``, or less
    where a cgroup v2 memory limit leaves less room. None where neither can be read."""
    room: int | None = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                room = int(line.split()[1]) * 1024
                break
    with contextlib.suppress(OSError, ValueError, StopIteration):
        # cgroup v2: the line "0::/path/of/our/group" of /proc/self/cgroup
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        path = next(ln[3:] for ln in lines if ln.startswith("0::"))
        group = Path("/sys/fs/cgroup") / path.lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            left = int(limit) - int((group / "memory.current").read_text())
            room = left if room is None else min(room, left)
    return room


class Segment:
    """One mapped segment of ``size`` bytes: ``buf`` (writable), ``fd`` and ``name`` (None for
    a memfd). :meth:`close` unmaps (or leaves the mapping to the last live view) and unlinks a
    named segment."""

    def __init__(self, size: int, name: str | None) -> None:
        # a memfd has no size limit of its own: reserving more than the free memory would
        # end in the OOM killer (of this process or another), not in an error
        room = memory_available()
        if room is not None and size > room:
            raise CapacityError(
                f"host tier: cannot reserve {size} bytes of shared memory: only {room} bytes "
                "of memory are available; lower the host capacity")
        self.size = size
        self.name = name
        self._shm: SharedMemory | None = None
        self._mmap: mmap.mmap | None = None
        if name is not None:
            self._shm = _open_untracked(name, create=True, size=size)
            self.fd: int = self._shm._fd  # type: ignore[attr-defined]
        else:
            self.fd = os.memfd_create("kvstore-host", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, size)
        self._commit()
        if self._shm is not None:
            buf = self._shm.buf
            if buf is None:  # typeshed allows it; a segment just created has a buffer
                raise RuntimeError(f"host tier: shared memory {name} is not mapped")
            self.buf: memoryview = buf
        else:
            self._mmap = mmap.mmap(self.fd, size)
            self.buf = memoryview(self._mmap)

    def _commit(self) -> None:
        """Back the whole segment with memory now. A tmpfs segment is sparse: without this, a
        /dev/shm too small for the capacity surfaces as SIGBUS on some later write (a crash,
        not an error), and every first write to a page pays a page fault on the hot path."""
        try:
            os.posix_fallocate(self.fd, 0, self.size)
        except OSError as exc:
            self.close()
            raise CapacityError(
                f"host tier: cannot reserve {self.size} bytes of shared memory "
                f"({exc.strerror}); lower the host capacity or enlarge /dev/shm"
            ) from exc

    def fault_in(self) -> None:
        pages = np.frombuffer(self.buf, np.uint8)
        pages[:: mmap.PAGESIZE] = 0  # fault every page in once, at start
        del pages

    def close(self) -> None:
        """Unmap and forget; a view someone still holds keeps the mapping until it goes."""
        buf = getattr(self, "buf", None)  # None: closed before it was mapped
        with contextlib.suppress(BufferError):  # numpy views of it: the mapping outlives us
            if buf is not None:
                buf.release()
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:  # a live view: the mapping goes with it (mmap on dealloc)
                log.debug("host tier: memfd slab still has exported views at close")
            self._mmap = None
        if self.fd >= 0 and self._shm is None:
            os.close(self.fd)
            self.fd = -1
        if self._shm is not None:
            _close_named(self._shm)
            self._shm = None
            self.fd = -1


def _close_named(shm: SharedMemory) -> None:
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
