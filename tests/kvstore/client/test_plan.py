"""Splitting batched client calls into frames within the server's limits (no server needed)."""

from __future__ import annotations

from kvstore.client.discovery import Route
from kvstore.client.plan import batches, get_batch, slab_room


def test_batches_respect_frame_and_count_limits() -> None:
    info = Route("i", True, "/s", None, 0, max_frame_bytes=(1 << 20) + 100, max_batch=3)
    assert batches([30] * 7, info) == [(0, 3), (3, 6), (6, 7)]
    assert batches([40] * 3, info) == [(0, 2), (2, 3)]
    assert batches([60, 60, 10], info) == [(0, 1), (1, 3)]
    assert batches(None, info, count=4) == [(0, 3), (3, 4)]
    assert batches([], info) == []


def test_shared_memory_batches_fit_a_quarter_of_the_slab() -> None:
    info = Route("i", True, "/s", "shm", 64 << 20, max_frame_bytes=256 << 20,
                      max_batch=65536)
    assert slab_room(info) == 16 << 20
    assert get_batch(info, 64 << 10) == 256 and get_batch(info, None) == 16
    plan = batches([1 << 20] * 40, info, max_bytes=slab_room(info))
    assert plan == [(0, 16), (16, 32), (32, 40)]
