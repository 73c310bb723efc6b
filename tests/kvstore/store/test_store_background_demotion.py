"""Background demotion (``background_demotion``, kvstore/store/demoter.py): the host tier is
settled into the disk tier from a thread, the disk write runs without the store lock, and a
block deleted while its batch is being written is not left behind on disk."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import pytest

from kvstore.store import Store, demoter
from kvstore.store.index import make_keys

from .conftest import StoreFactory, blocks


class InFlight(NamedTuple):
    """A store whose demoter is inside its first disk write; ``release`` lets it go on."""

    store: Store
    hashes: list[bytes]
    data: list[bytes]
    release: threading.Event


def _batch_in_flight(make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, *,
                     disk: int = 256, n: int = 14, written: bool = False) -> InFlight:
    """Put ``n`` blocks into a 16-block host tier (watermarks 0.5/0.75) and hold the
    demoter's disk write until ``release``: before it writes, or, with ``written``, after it
    wrote (the batch in the file, not yet recorded). Only the demoter's writes are held."""
    store = make_store(host=16, disk=disk, host_watermarks=(0.5, 0.75), background_demotion=True)
    entered, release = threading.Event(), threading.Event()
    tier = store.tier("disk")
    real = tier.put_many

    def held(items: Sequence[Any]) -> None:
        if threading.current_thread().name != "kvstore-demote":
            real(items)
            return
        if written:
            real(items)
        entered.set()
        assert release.wait(30)
        if not written:
            real(items)

    monkeypatch.setattr(tier, "put_many", held)
    hashes, data = blocks(n)
    store.put("m", hashes[:14], data[:14])
    assert entered.wait(10)
    return InFlight(store, hashes, data, release)


def test_puts_past_the_high_watermark_are_settled_in_the_background(
    make_store: StoreFactory,
) -> None:
    store = make_store(host=16, disk=256, host_watermarks=(0.5, 0.75), background_demotion=True)
    hashes, data = blocks(14)
    for i in range(0, 14, 2):  # never over capacity: only the watermark asks for demotion
        store.put("m", hashes[i:i + 2], data[i:i + 2])
    assert store.settled(10)
    host = store.stats().tiers["host"]
    assert host.blocks <= 8
    assert host.demotions == host.evictions == 14 - host.blocks
    assert store.stats().totals.dropped == 0
    store.check_integrity()
    assert store.get("m", hashes, promote=False) == data


def test_the_disk_write_runs_without_the_store_lock(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, hashes, data, release = _batch_in_flight(make_store, monkeypatch)
    try:  # the demoter is inside the disk write ...
        got: list[Any] = []
        reader = threading.Thread(target=lambda: got.append(store.get("m", hashes[-2:])))
        reader.start()
        reader.join(5)
        assert got == [data[-2:]]  # ... and a get that takes the store lock goes through
    finally:
        release.set()
    assert store.settled(10)
    store.check_integrity()
    assert store.get("m", hashes, promote=False) == data


def test_a_block_deleted_while_its_batch_is_written_is_not_left_on_disk(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, hashes, data, release = _batch_in_flight(make_store, monkeypatch)
    assert store.delete("m", hashes[:3]) == 3  # the coldest: in the batch being written
    release.set()
    assert store.settled(10)
    disk = store.tier("disk")
    assert not any(disk.contains(key) for key in make_keys("m", hashes[:3]))
    assert store.get("m", hashes[:3]) == [None] * 3
    store.check_integrity()
    assert store.get("m", hashes[3:], promote=False) == data[3:]


def test_a_block_deleted_and_put_again_while_its_batch_is_written_is_kept_once(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, hashes, data, release = _batch_in_flight(make_store, monkeypatch)
    assert store.delete("m", hashes[:2]) == 2  # in the batch being written ...
    store.put("m", hashes[:2], data[:2])  # ... and put again, into the host tier
    release.set()
    assert store.settled(10)
    store.check_integrity()
    assert store.get("m", hashes, promote=False) == data
    assert store.stats().namespaces["m"].blocks == 14


def test_a_full_disk_makes_room_while_a_batch_is_written_to_it(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The batch is in the disk file but not yet recorded (the demoter waits for the lock):
    the disk samples its keys as victims (never touched there, they come first), yet the store
    does not count them as the disk's, so evicting them frees nothing. A put that must make
    room on the disk meanwhile used to loop on those victims forever, holding the store lock;
    now only blocks the store records on the disk are named."""
    store, hashes, data, release = _batch_in_flight(make_store, monkeypatch, disk=16, n=44,
                                                    written=True)
    try:
        done: list[int] = []

        def fill() -> None:  # through the request path: host full, then disk full
            for i in range(14, 44, 2):
                store.get("m", hashes[:6])  # the batch stays hot: the host keeps it
                store.put("m", hashes[i:i + 2], data[i:i + 2])
            done.append(1)

        writer = threading.Thread(target=fill, daemon=True)
        writer.start()
        writer.join(20)
        assert done == [1], "the put never finished (it kept the store lock)"
        assert "freed nothing" not in caplog.text  # only blocks it holds were named
    finally:
        release.set()
    assert store.settled(10)
    store.check_integrity()
    stats = store.stats().tiers
    assert all(stats[t].bytes <= 16 * len(data[0]) for t in ("host", "disk"))
    assert store.get("m", hashes[-2:], promote=False) == data[-2:]


@pytest.mark.parametrize("shm", [False, True], ids=["put", "reserve_write"])
def test_a_write_that_does_not_fit_waits_for_the_batch_in_flight_without_the_lock(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, shm: bool,
) -> None:
    """The host tier is full but for the batch being written down: a write that does not fit
    (a put, or a shared-memory reservation off the event loop) waits for that batch to land
    instead of evicting under the store lock, so a get beside it goes through meanwhile, and
    the request path writes nothing to the disk itself."""
    monkeypatch.setattr(demoter, "ROOM_WAIT_S", 60.0)  # however slow this machine is
    store, hashes, data, release = _batch_in_flight(make_store, monkeypatch, n=18)
    disk = store.tier("disk")
    held = disk.put_many
    writes: list[int] = []

    def counted(items: Sequence[Any]) -> None:
        if threading.current_thread().name != "kvstore-demote":
            writes.append(len(items))
        held(items)

    def write() -> None:
        if shm:
            got = store.reserve_write("m", hashes[14:])
            done.append(sum(e is not None for e in got.extents))
            store.abort_write("m", hashes[14:])
        else:
            done.append(store.put("m", hashes[14:], data[14:]).stored)

    monkeypatch.setattr(disk, "put_many", counted)
    done: list[int] = []
    writer = threading.Thread(target=write)
    writer.start()
    try:
        writer.join(0.3)
        assert not done  # 14 + 4 blocks do not fit in 16: it waits for the batch
        got: list[Any] = []
        reader = threading.Thread(target=lambda: got.append(store.get("m", hashes[10:14])))
        reader.start()
        reader.join(5)
        assert got == [data[10:14]]  # the waiting write does not hold the store lock
    finally:
        release.set()
    writer.join(10)
    assert done == [4]
    assert writes == []  # the batch made the room
    assert store.settled(10)
    store.check_integrity()
    kept = len(hashes) if not shm else 14
    assert store.get("m", hashes[:kept], promote=False) == data[:kept]
