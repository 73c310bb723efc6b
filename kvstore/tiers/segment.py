"""Shared memory segments of the host tier: a named POSIX segment, or an anonymous memfd.

A **memfd** (``memfd_create``) has no name in ``/dev/shm``: no other process can open it unless
it is handed the file descriptor (the server sends it over its authenticated Unix socket with
``SCM_RIGHTS``) or may inspect this process (same user with ptrace rights via ``/proc/<pid>/fd``,
or root). A **named** segment is a file of ``/dev/shm`` (what ``shm_open`` makes), created
exclusively with mode ``0600``: any process of the same user can map it by name
(:func:`attach_slab`); kept for library use and tests.

The segment is opened and mapped here with plain ``os`` and ``mmap`` calls, not through
:mod:`multiprocessing.shared_memory`, whose resource tracker would unlink a segment when any
process that attached it exits (destroying the server's slab with an exiting client) and warn
about segments the tier unlinks on its own schedule. The creator alone unlinks a named segment.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from pathlib import Path

from kvstore.errors import CapacityError

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"  # where Linux's shm_open keeps POSIX shared memory
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def _path(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"shared memory name {name!r} is not a plain file name")
    return f"{SHM_DIR}/{name}"


def attach_slab(shm_name: str, *, populate: bool = False) -> Segment:
    """Map a named host tier slab from another process (name from ``SlabInfo.shm_name``);
    with ``populate``, its page tables filled at once (:func:`map_shared`).

    Read and write ``seg.buf`` at the extents the store returns; call ``seg.close()`` when
    done, which never unlinks: the segment belongs to the tier. Raises ``OSError`` when the
    segment cannot be opened, ``ValueError`` for a name that is no shared memory name."""
    fd = os.open(_path(shm_name), _OPEN)
    try:
        size = os.fstat(fd).st_size
        mapping = map_shared(fd, size, populate=populate)  # keeps its own reference
    finally:
        os.close(fd)
    return Segment(mapping, shm_name, fd=-1, owner=False)


def map_shared(fd: int, size: int, *, populate: bool = False) -> mmap.mmap:
    """``size`` bytes of ``fd`` mapped shared, read-write. With ``populate`` the kernel fills
    this process's page tables for the whole mapping now (``MAP_POPULATE``, about 70 ms per
    GiB of a segment already backed), so that a copy into a place this process has not
    touched yet does not take a page fault every 4 KiB: a client that copies blocks in and
    out pays once, at mapping, what it would otherwise pay on its first pass over the slab."""
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    return mmap.mmap(fd, size, flags=flags)


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
    """One mapped segment: ``buf`` (writable), ``size``, ``name`` (None for a memfd) and
    ``fd`` (-1 for a segment attached by name). :meth:`close` unmaps (or leaves the mapping to
    the last live view), closes ``fd`` and, for the segment's creator, unlinks its name."""

    def __init__(self, mapping: mmap.mmap, name: str | None, fd: int, owner: bool) -> None:
        self._mmap: mmap.mmap | None = mapping
        self.buf = memoryview(mapping)
        self.size = len(mapping)
        self.name = name
        self.fd = fd
        self._owner = owner

    @classmethod
    def create(cls, size: int, name: str | None) -> Segment:
        """A new segment of ``size`` bytes, all backed by memory now and mapped with its page
        tables filled (:func:`map_shared`); named ``name`` in ``/dev/shm``
        (``FileExistsError`` if taken), or an anonymous memfd for None."""
        # a memfd has no size limit of its own: reserving more than the free memory would
        # end in the OOM killer (of this process or another), not in an error
        room = memory_available()
        if room is not None and size > room:
            raise CapacityError(
                f"host tier: cannot reserve {size} bytes of shared memory: only {room} bytes "
                "of memory are available; lower the host capacity")
        if name is None:
            fd = os.memfd_create("kvstore-host", os.MFD_CLOEXEC)
        else:  # private to this user whatever the umask, and never someone else's file
            fd = os.open(_path(name), _OPEN | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            _commit(fd, size)
            mapping = map_shared(fd, size, populate=True)
        except BaseException:
            os.close(fd)
            if name is not None:
                os.unlink(_path(name))
            raise
        return cls(mapping, name, fd, owner=True)

    def close(self) -> None:
        """Unmap and forget; a view someone still holds keeps the mapping until it goes (mmap
        unmaps on dealloc). The name goes now all the same. Closing twice does nothing."""
        if self._mmap is None:
            return
        with contextlib.suppress(BufferError):  # numpy views of it: the mapping outlives us
            self.buf.release()
        try:
            self._mmap.close()
        except BufferError:
            log.debug("host tier: slab %s still has exported views at close", self.name)
        self._mmap = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._owner and self.name is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_path(self.name))


def _commit(fd: int, size: int) -> None:
    """Back the whole segment with memory now. A tmpfs segment is sparse: without this, a
    /dev/shm too small for the capacity surfaces as SIGBUS on some later write (a crash, not
    an error), and every first write to a page pays a page fault on the hot path."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        raise CapacityError(
            f"host tier: cannot reserve {size} bytes of shared memory "
            f"({exc.strerror}); lower the host capacity or enlarge /dev/shm"
        ) from exc
