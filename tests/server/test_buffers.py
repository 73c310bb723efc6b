"""The data plane's receive buffer pool: reuse, size fit, and the idle bound."""

from __future__ import annotations

from server.dataplane.buffers import SMALL, BufferPool


def test_buffers_are_reused_within_twice_the_size() -> None:
    pool = BufferPool(64 << 20)
    big = pool.take(8 << 20)
    assert len(big) == 8 << 20
    pool.give(big)
    assert pool.idle_bytes == 8 << 20
    assert pool.take(5 << 20) is big  # fits, not more than twice the size
    pool.give(big)
    assert pool.take(3 << 20) is not big  # would waste over half of it
    assert pool.take(9 << 20) is not big  # too small
    assert pool.take(8 << 20) is big
    assert pool.idle_bytes == 0


def test_smallest_fitting_buffer_wins_and_idle_bytes_stay_bounded() -> None:
    pool = BufferPool(20 << 20)
    a, b, c = pool.take(12 << 20), pool.take(6 << 20), pool.take(4 << 20)
    for buf in (a, b, c):
        pool.give(buf)
    assert pool.idle_bytes <= 20 << 20
    assert a not in pool._idle  # the oldest went first
    assert pool.take(4 << 20) is c
    pool.give(bytearray(64 << 20))  # larger than the whole pool: not kept
    pool.give(bytearray(SMALL))  # small: never pooled
    assert pool.idle_bytes == 6 << 20
