"""Checksums: every block has one from the moment it is acknowledged (memory tiers too), it is
the checksum of the bytes that were put, it goes down with the block (demotion, spill,
write-through, a put naming the tier), and bytes that no longer match are never handed out."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb

from kvstore.checksum import checksum
from kvstore.store import Store

from .conftest import BLOCK, StoreFactory, blocks


def _disk_sums(store: Store, hashes: list[bytes]) -> list[int | None]:
    metas = dict(store.tier("disk").scan())
    return [m.checksum if (m := metas.get(("m", h))) else None for h in hashes]


def _flip_on_disk(folder: Path, hashes: list[bytes]) -> None:
    env = lmdb.open(str(folder / "lmdb"), subdir=True, max_dbs=0, lock=True)
    with env.begin(write=True) as txn:
        for h in hashes:
            value = bytearray(txn.get(b"m\x00" + h))
            value[-1] ^= 0x01
            txn.put(b"m\x00" + h, bytes(value))
    env.close()


def _shm_put(store: Store, hashes: list[bytes], data: list[bytes]) -> None:
    slab = store.host_slab()
    assert slab is not None
    view = store.tier("host").view(0, slab.size)
    for ext, d in zip(store.reserve_write("m", hashes, owner="w").extents, data, strict=True):
        assert ext is not None
        pos = 0
        for off, n in ext:
            view[off:off + n] = d[pos:pos + n]
            pos += n
    del view
    assert store.commit_write("m", hashes, owner="w").stored == len(hashes)


def test_demotion_records_the_checksum_of_what_was_put(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(18)
    store.put("m", hashes[:6], data[:6])
    _shm_put(store, hashes[6:12], data[6:12])  # evicts the first blocks to disk
    store.put("m", hashes[12:], data[12:])  # and now the shared-memory ones
    on_disk = [(h, s) for h, s in zip(hashes, _disk_sums(store, hashes), strict=True) if s]
    assert {h for h, _ in on_disk} >= set(hashes[:12])
    for h, s in on_disk:
        assert s == checksum(data[hashes.index(h)])
    assert store.get("m", hashes) == data
    store.check_integrity()


def test_shared_memory_blocks_spilled_on_close_are_verified_after_restart(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(6)
    _shm_put(store, hashes, data)
    assert _disk_sums(store, hashes) == [None] * 6  # memory only: not hashed yet
    store.close()  # spills to disk, hashing each block on the way
    _flip_on_disk(tmp_path, hashes[:2])
    again = make_store(host=8, disk=64, register=False)
    assert again.get("m", hashes) == [None, None, *data[2:]]
    assert again.stats().totals.corrupt_dropped == 2
    again.check_integrity()


def test_put_naming_disk_stores_the_held_bytes_not_the_callers(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(2)
    store.put("m", hashes, data)
    other = [os.urandom(BLOCK) for _ in hashes]  # same hashes, different bytes
    assert store.put("m", hashes, other, tier="disk").existing == 2
    assert store.tier("disk").get_many([("m", h) for h in hashes]) == data
    assert _disk_sums(store, hashes) == [checksum(d) for d in data]
    store.check_integrity()


def test_write_through_hashes_on_the_put_path(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64, disk_write_through=True)
    hashes, data = blocks(3)
    _shm_put(store, hashes, data)
    store.put("m", *blocks(2))
    assert _disk_sums(store, hashes) == [checksum(d) for d in data]
    store.check_integrity()


def _host_view(store: Store, key: bytes) -> memoryview:
    (off, n), = store.acquire_read("m", [key], owner="peek").extents[0] or []
    store.release("m", [key], owner="peek")
    return store.tier("host").view(off, n)


def test_every_acknowledged_block_has_its_checksum_in_memory(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(4)
    store.put("m", hashes[:2], data[:2])
    _shm_put(store, hashes[2:], data[2:])
    got = store.acquire_read("m", hashes, owner="r")
    assert got.sums == [checksum(d) for d in data]


def test_a_commit_whose_bytes_differ_from_the_writers_checksum_is_refused(
        make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(2)
    reserved = store.reserve_write("m", hashes, owner="w")
    view = store.tier("host").view(0, store.host_slab().size)  # type: ignore[union-attr]
    for ext, d in zip(reserved.extents, data, strict=True):
        (off, n), = ext or []
        view[off:off + n] = d
    del view
    result = store.commit_write("m", hashes, owner="w",
                                sums=[checksum(data[0]), checksum(data[1]) ^ 1])
    assert (result.stored, result.refused) == (1, 1)
    assert store.get("m", hashes) == [data[0], None]
    assert store.put("m", hashes[1:], data[1:], sums=[checksum(data[0])]).refused == 1
    assert store.put("m", hashes[1:], data[1:], sums=[checksum(data[1])]).stored == 1
    store.check_integrity()


def test_flipped_host_bytes_are_a_miss_and_never_demoted(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(12)
    store.put("m", hashes[:2], data[:2])
    for key in hashes[:2]:
        _host_view(store, key)[7] ^= 0xFF
    assert store.get("m", hashes[:1]) == [None]  # a read: dropped, counted
    store.put("m", hashes[2:], data[2:])  # the other is evicted to disk: checked first
    assert store.get("m", hashes[:2]) == [None, None]
    assert store.tier("disk").get_many([("m", hashes[1])]) == [None]
    host = store.stats().tiers["host"]
    assert host.corrupt_by_cause == {"read": 1, "demote": 1}
    assert host.corrupt_dropped == 2
    assert [g.why for g in store.trace("m", hashes[:2]).ghosts if g] == ["corrupt"] * 2
    store.check_integrity()


def test_background_demotion_never_writes_flipped_host_bytes(make_store: StoreFactory) -> None:
    store = make_store(host=16, disk=64, host_watermarks=(0.5, 0.75), background_demotion=True)
    hashes, data = blocks(14)
    store.put("m", hashes[:2], data[:2])
    _host_view(store, hashes[0])[3] ^= 0xFF
    store.put("m", hashes[2:], data[2:])  # past the high watermark: the thread settles it
    assert store.settled(10)
    assert store.get("m", hashes[:2]) == [None, data[1]]
    assert store.tier("disk").get_many([("m", hashes[0])]) == [None]
    assert store.stats().tiers["host"].corrupt_by_cause == {"demote": 1}
    store.check_integrity()
