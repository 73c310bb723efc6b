"""``nowait=True`` calls (the data plane runs them on its event loop): they finish in memory or
raise WouldBlock having changed nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kvstore.errors import WouldBlock
from kvstore.store import Store

from .conftest import StoreFactory, blocks


def _held_elsewhere(store: Store) -> tuple[threading.Event, threading.Event]:
    """Hold the store lock on another thread until the returned ``done`` is set."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with store._lock:
            held.set()
            done.wait(10)

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10)
    return held, done


def test_nowait_calls_refuse_a_busy_lock_and_change_nothing(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(2)
    store.put("m", hashes[:1], data[:1])
    _, done = _held_elsewhere(store)
    try:
        for call in (
            lambda: store.lookup("m", hashes, nowait=True),
            lambda: store.reserve_write("m", hashes, owner="w", nowait=True),
            lambda: store.commit_write("m", hashes, owner="w", nowait=True),
            lambda: store.acquire_read("m", hashes, owner="r", nowait=True),
            lambda: store.release("m", hashes, owner="r", nowait=True),
        ):
            with pytest.raises(WouldBlock):
                call()
    finally:
        done.set()
    assert store.reserve_write("m", hashes[1:], owner="w").extents != [None]  # nothing was reserved
    assert store.stats().totals.pinned == 0
    store.check_integrity()


def test_nowait_reserve_refuses_to_evict(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64, host_watermarks=(0.99, 1.0))
    hashes, data = blocks(9)
    store.put("m", hashes[:7], data[:7])
    assert store.reserve_write("m", hashes[7:8], owner="w", nowait=True).extents != [None]  # fits
    with pytest.raises(WouldBlock, match="evict"):
        store.reserve_write("m", hashes[8:], owner="w", nowait=True)
    assert store.lookup("m", hashes).prefix_blocks == 7  # nothing was demoted
    assert store.reserve_write("m", hashes[8:], owner="w").extents != [None]  # blocking: evicts
    assert store.lookup("m", hashes[:7]).tiers.count("disk") == 1
    store.check_integrity()


def test_nowait_commit_refuses_write_through_and_settling(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    through = make_store(host=8, disk=64, disk_write_through=True, path=tmp_path / "a")
    hashes, _ = blocks(1)
    assert through.reserve_write("m", hashes, owner="w", nowait=True).extents != [None]
    with pytest.raises(WouldBlock):
        through.commit_write("m", hashes, owner="w", nowait=True)
    assert through.lookup("m", hashes).prefix_blocks == 0
    assert through.commit_write("m", hashes, owner="w").stored == 1
    assert through.lookup("m", hashes).tiers == ["host"]

    store = make_store(host=8, disk=64, host_watermarks=(0.5, 0.6), path=tmp_path / "b")
    hashes, _ = blocks(5)  # 5 of 8 slots: past the high watermark once published
    assert None not in store.reserve_write("m", hashes, owner="w", nowait=True).extents
    with pytest.raises(WouldBlock):
        store.commit_write("m", hashes, owner="w", nowait=True)
    assert store.commit_write("m", hashes, owner="w").stored == 5
    assert store.lookup("m", hashes).tiers.count("disk") >= 1  # settled down to the low mark
    store.check_integrity()


def test_nowait_read_refuses_to_promote(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(1)
    store.put("m", hashes, data, tier="disk")
    with pytest.raises(WouldBlock, match="promoted"):
        store.acquire_read("m", hashes, owner="r", nowait=True)
    assert store.lookup("m", hashes).tiers == ["disk"]
    assert store.acquire_read("m", hashes, owner="r").extents[0] is not None  # blocking: promotes
    assert store.acquire_read("m", hashes, owner="r", nowait=True).extents[0] is not None
    assert store.release("m", hashes, owner="r", nowait=True) == 1  # one pin, renewed


def test_read_without_promotion_serves_only_what_the_host_tier_holds(
    make_store: StoreFactory,
) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(3)
    store.put("m", hashes[:1], data[:1], tier="disk")
    store.put("m", hashes[1:2], data[1:2])
    got = store.acquire_read("m", hashes, owner="r", nowait=True, promote=False).extents
    assert got[0] is None and got[1] is not None and got[2] is None  # disk, host, missing
    assert store.lookup("m", hashes[:2]).tiers == ["disk", "host"]  # nothing promoted
    assert store.stats().totals.pinned == 1
    assert store.stats().totals.queries == 1  # only the block served was read
    assert store.release("m", hashes, owner="r") == 1
    store.check_integrity()
