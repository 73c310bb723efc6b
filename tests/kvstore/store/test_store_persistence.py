"""Restart, corruption and the shared-memory write/read path."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import lmdb
import pytest

from kvstore.errors import CapacityError

from .conftest import BLOCK, StoreFactory, blocks


def test_restart_finds_every_block_byte_identical(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(30)
    store.put("m", hashes, data)
    store.close()  # spills host-only blocks to disk
    again = make_store(host=4, disk=64, register=False)
    assert again.namespace("m").block_bytes == BLOCK  # namespaces persisted
    assert again.lookup("m", hashes).prefix_blocks == 30
    assert again.get("m", hashes) == data
    again.check_integrity()


def test_restart_without_spill_keeps_what_was_on_disk(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64, spill_on_close=False)
    hashes, data = blocks(10)
    store.put("m", hashes, data)
    on_disk = [h for h, t in zip(hashes, store.lookup("m", hashes).tiers, strict=True)
               if t == "disk"]
    assert len(on_disk) >= 6
    store.close()
    again = make_store(host=4, disk=64, register=False)
    got = again.get("m", hashes)
    for h, g, d in zip(hashes, got, data, strict=True):
        if h in on_disk:
            assert g == d
        else:
            assert g is None


def test_flipped_byte_on_disk_becomes_a_counted_miss(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    store = make_store(host=2, disk=64)
    hashes, data = blocks(6)
    store.put("m", hashes, data)
    store.close()
    env = lmdb.open(str(tmp_path / "lmdb"), subdir=True, max_dbs=0, lock=True)
    with env.begin(write=True) as txn:
        key = b"m\x00" + hashes[0]
        value = bytearray(txn.get(key))
        value[-1] ^= 0xFF  # flip the last payload byte, header intact
        txn.put(key, bytes(value))
    env.close()
    again = make_store(host=2, disk=64, register=False)
    got = again.get("m", hashes)
    assert got[0] is None
    assert got[1:] == data[1:]
    stats = again.stats()
    assert stats.totals.corrupt_dropped == 1
    assert stats.tiers["disk"].corrupt_dropped == 1
    assert not again.contains("m", hashes[0])
    again.check_integrity()


def test_shared_memory_write_then_read(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    slab = store.host_slab()
    assert slab is not None and slab.slot_bytes == BLOCK
    view = store.tier("host").view(0, slab.size)
    hashes, data = blocks(3)
    extents = store.reserve_write("m", hashes, lease_s=30, owner="c1").extents
    assert all(e is not None for e in extents)
    assert store.lookup("m", hashes).prefix_blocks == 0  # invisible until committed
    for ext, d in zip(extents, data, strict=True):
        pos = 0
        for off, n in ext:
            view[off:off + n] = d[pos:pos + n]
            pos += n
    assert store.commit_write("m", hashes, owner="c1") == (3, 0, 0)
    assert store.get("m", hashes) == data
    # a second reservation of stored blocks is skipped
    assert store.reserve_write("m", hashes, owner="c2").extents == [None, None, None]
    # reading through the slab pins the blocks until released
    read = store.acquire_read("m", hashes + [os.urandom(32)], owner="c2").extents
    assert read[-1] is None
    for ext, d in zip(read[:3], data, strict=True):
        assert b"".join(bytes(view[o:o + n]) for o, n in ext) == d
    assert store.stats().totals.pinned == 3
    assert store.release("m", hashes, owner="c2") == 3
    store.check_integrity()
    del view


def test_shared_memory_reservations_abort_and_expire(make_store: StoreFactory) -> None:
    import time

    store = make_store(host=4, disk=64)
    hashes, _ = blocks(2)
    store.reserve_write("m", hashes[:1], owner="c1")
    assert store.abort_write("m", hashes[:1], owner="c1") == 1
    store.reserve_write("m", hashes[1:], lease_s=0.05, owner="c1")
    time.sleep(0.1)
    assert store.expire_leases() == 1
    assert store.commit_write("m", hashes[1:], owner="c1").refused == 1
    assert store.tier("host").used_bytes() == 0
    store.check_integrity()


def test_shared_memory_read_promotes_from_disk(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(8)
    store.put("m", hashes, data)
    extents = store.acquire_read("m", hashes[:1], owner="c").extents
    view = store.tier("host").view(0, store.host_slab().size)
    assert b"".join(bytes(view[o:o + n]) for o, n in extents[0]) == data[0]
    del view


def test_reserving_more_than_fits_raises(make_store: StoreFactory) -> None:
    store = make_store(host=2, disk=0, host_watermarks=(1.0, 1.0))
    hashes, data = blocks(2)
    store.put("m", hashes, data)
    store.pin("m", hashes, lease_s=60)
    with pytest.raises(CapacityError):
        store.reserve_write("m", [os.urandom(32)], owner="c")
    store.check_integrity()


def test_concurrent_puts_and_gets_keep_the_store_consistent(make_store: StoreFactory) -> None:
    store = make_store(host=16, disk=256)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            hashes, data = blocks(24)
            for i in range(0, 24, 4):
                store.put("m", hashes[i:i + 4], data[i:i + 4])
                got = store.get("m", hashes[: i + 4])
                assert got == data[: i + 4]
                store.lookup("m", hashes)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store.check_integrity()


def test_shared_memory_read_that_cannot_stage_raises_instead_of_missing(
    make_store: StoreFactory,
) -> None:
    store = make_store(host=2, disk=64, host_watermarks=(1.0, 1.0))
    hashes, data = blocks(4)
    store.put("m", hashes, data)  # the first two are demoted to disk
    store.pin("m", hashes[2:], lease_s=60)  # the host tier is all pinned
    with pytest.raises(CapacityError, match="could not be staged"):
        store.acquire_read("m", hashes[:1], owner="c")
    assert store.get("m", hashes[:1], promote=False) == data[:1]
    store.check_integrity()


def test_shared_memory_batch_naming_a_block_twice(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    h, d = blocks(1)
    extents = store.reserve_write("m", h + h, owner="c").extents
    assert extents[0] is not None and extents[1] is None
    view = store.tier("host").view(0, store.host_slab().size)
    for off, n in extents[0]:
        view[off:off + n] = d[0][:n]
    del view
    assert store.commit_write("m", h + h, owner="c") == (1, 1, 0)
    assert store.get("m", h) == d
    store.check_integrity()


def test_deleting_a_block_being_read_keeps_its_bytes_until_the_pins_run_out(
    make_store: StoreFactory,
) -> None:
    store = make_store(host=16, disk=0)
    hashes, data = blocks(4)
    store.put("m", hashes, data)
    (extents,) = store.acquire_read("m", hashes[:1], lease_s=0.3, owner="reader").extents
    assert extents is not None
    assert store.delete("m", hashes) == 4
    assert store.lookup("m", hashes).prefix_blocks == 0
    new_hashes, new_data = blocks(3)
    assert store.put("m", new_hashes, new_data).stored == 3  # must not take the read slots
    view = store.tier("host").view(0, store.host_slab().size)  # type: ignore[union-attr]
    assert b"".join(bytes(view[o:o + n]) for o, n in extents) == data[0]
    del view
    store.check_integrity()
    assert store.tier("host").used_bytes() == 4 * BLOCK  # 3 new blocks + the retired one
    time.sleep(0.35)
    store.expire_leases()
    assert store.tier("host").used_bytes() == 3 * BLOCK
    store.check_integrity()
