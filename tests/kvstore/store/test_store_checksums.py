"""Lazy checksums: blocks that only memory tiers hold carry none; the checksum is computed when
a block first goes to disk (demotion, spill, write-through, a put naming the tier) and must be
the checksum of the bytes that were put."""

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
    assert again.stats()["totals"]["corrupt_dropped"] == 2
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
