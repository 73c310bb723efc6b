"""Copies that step around the 4K-aliasing trap of ``rep movsb``.

glibc copies buffers of some KiB up to the L2 cache's size with ``rep movsb`` on CPUs that
advertise fast string moves. On AMD Zen 3 and 4 that instruction crawls when the destination
lies 1 to 31 bytes past the source modulo 4096 (a store and the next loads alias the same
4 KiB offsets): a 128 KiB copy takes ten times as long, and a copy from memory three times.
It is exactly what happens between the slab's page-aligned places and a ``bytearray`` of some
hundred KiB, whose bytes start 16 bytes into a page (glibc's header before a mapped chunk).

:func:`trapped` says whether a copy would fall in it: the CPU is probed once (a copy at that
distance against one that is not, in cache) and the distance checked for each copy. A copy
that would is made through a scratch buffer placed half a page from the source, which
costs one extra pass through cache instead of the stall.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import time

import numpy as np

PAGE = 4096
NEAR = 64  # destinations closer than this past the source (modulo PAGE) are avoided
_PROBE = 16 << 10  # bytes copied to probe the CPU: in cache, long enough for rep movsb
_local = threading.local()
_slow: bool | None = None  # whether this CPU copies slowly at a short aliasing distance


def address(view: memoryview) -> int:
    """Where ``view``'s first byte lies in this process (``view`` has at least one)."""
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    return int(np.frombuffer(view, np.uint8).__array_interface__["data"][0])


def slow_when_aliased() -> bool:
    """Whether a copy whose destination lies just past its source modulo 4 KiB takes over
    three times as long here as one that does not (the fastest of a few tries of each, in
    cache: about a millisecond, once per process)."""
    global _slow
    if _slow is None:
        area = mmap.mmap(-1, 4 * _PROBE)
        view = memoryview(area)
        try:
            src = view[:_PROBE]

            def best(offset: int) -> int:
                dst = view[offset:offset + _PROBE]
                times = []
                for _ in range(9):
                    start = time.perf_counter_ns()
                    dst[:] = src
                    times.append(time.perf_counter_ns() - start)
                return min(times)

            _slow = best(2 * _PROBE + 16) > 3 * best(2 * _PROBE + PAGE // 2)
        finally:
            src.release()
            view.release()
            area.close()
    return _slow


def trapped(dest: memoryview, src: memoryview) -> bool:
    """Whether copying ``src`` into ``dest`` would step into the trap on this CPU."""
    if not src.nbytes or not slow_when_aliased():
        return False
    return 0 < (address(dest) - address(src)) % PAGE < NEAR


def scratch_for(src: memoryview, size: int) -> memoryview:
    """``size`` bytes of this thread's scratch buffer, half a page away from ``src`` modulo
    4 KiB: a copy from ``src`` into it, and from it into a destination up to
    :data:`NEAR` bytes past ``src``, both stay clear of the trap."""
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < size + PAGE:
        buf = _local.buf = bytearray(size + PAGE)
    view = memoryview(buf)
    skew = (address(src) + PAGE // 2 - address(view)) % PAGE
    return view[skew:skew + size]
