"""Neighbouring slab extents merge into runs (server/dataplane/slab_runs.py)."""

from __future__ import annotations

from server.dataplane.slab_runs import coalesce


def test_neighbours_merge_and_anything_else_ends_the_run() -> None:
    items = [(0, 4), (4, 4), (8, 2), (16, 4), None, (20, 4), b"copy", (24, 4), (28, 4)]
    assert coalesce(items) == [(0, 10), (16, 4), None, (20, 4), b"copy", (24, 8)]


def test_a_run_never_reaches_backwards_or_over_a_gap() -> None:
    assert coalesce([(8, 4), (0, 8), (12, 4)]) == [(8, 4), (0, 8), (12, 4)]
    assert coalesce([(0, 4), (5, 4)]) == [(0, 4), (5, 4)]
    assert coalesce([]) == []
