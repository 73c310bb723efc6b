"""The cold index: blocks only the disk tier holds cost no RAM per block, a restart reads no
header, and blocks move between RAM and the disk file's index as their copies change."""

from __future__ import annotations

import logging
import os
import tracemalloc
from pathlib import Path

import lmdb
import pytest

from kvstore.checksum import checksum
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.disk.records import encode_key

from .conftest import BLOCK, NS, StoreFactory, blocks


def _fill_disk(folder: Path, n: int, size: int = 64) -> list[bytes]:
    """``n`` blocks of namespace ``m`` written straight into the disk file (fast setup)."""
    hashes = [os.urandom(32) for _ in range(n)]
    payload = os.urandom(size)
    meta = BlockMeta(NS.layout_id, checksum(payload), size)
    tier = DiskTier(1 << 30, path=str(folder / "lmdb"))
    for i in range(0, n, 5000):
        tier.put_many([(("m", h), payload, meta) for h in hashes[i:i + 5000]])
    tier.close()
    return hashes


def test_restart_over_many_disk_blocks_allocates_almost_nothing_per_block(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    make_store(host=0, disk=4).close()  # registers the namespace in ns.json
    n = 30_000
    hashes = _fill_disk(tmp_path, n, size=BLOCK)
    tracemalloc.start()
    try:
        # what-if trackers off: their miniature caches cost a fixed ~0.5 MB once a sampled
        # block is read (whatever the number of blocks; tests/kvstore/whatif bound them)
        store = make_store(host=0, disk=n + 10, register=False, whatif=None)
        assert store.lookup("m", hashes[:64]).prefix_blocks == 64
        assert store.get("m", hashes[100:101])[0] is not None
        now, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert now < 5 * n  # the index it replaced held ~750 bytes per block
    assert store.stats().namespaces["m"].blocks == n
    assert store.stats().tiers["disk"].blocks == n


def test_restart_reads_no_header(
    make_store: StoreFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged header is found when its block is asked for, not at start."""
    store = make_store(host=0, disk=16)
    hashes, data = blocks(4)
    store.put("m", hashes, data)
    store.close()
    env = lmdb.open(str(tmp_path / "lmdb"), subdir=True)
    with env.begin(write=True) as txn:
        raw = encode_key(("m", hashes[1]))
        txn.put(raw, b"XXXX" + bytes(txn.get(raw))[4:])
    env.close()
    caplog.set_level(logging.WARNING)
    again = make_store(host=0, disk=16, register=False)
    assert not [r for r in caplog.records if "header" in r.getMessage()]
    assert again.get("m", hashes) == [data[0], None, data[2], data[3]]
    assert again.lookup("m", hashes).prefix_blocks == 1


def test_blocks_move_between_ram_and_the_disk_index(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(20)
    store.put("m", hashes, data)  # the host tier holds 4: the rest were demoted to disk
    store.check_integrity()
    tiers = store.lookup("m", hashes).tiers
    assert tiers.count("disk") >= 14 and set(tiers) <= {"host", "disk"}
    assert store.get("m", hashes) == data  # promotes, demotes: every block crosses over
    store.check_integrity()
    assert store.delete("m", hashes[::2]) == 10
    store.check_integrity()
    assert store.stats().namespaces["m"].blocks == 10
    assert store.get("m", hashes[1::2]) == data[1::2]
    assert store.get("m", hashes[::2]) == [None] * 10
    assert store.delete_namespace("m") == 10
    store.check_integrity()
    assert store.stats().tiers["disk"].blocks == 0


def test_a_full_disk_keeps_its_hit_blocks(make_store: StoreFactory, tmp_path: Path) -> None:
    """The disk's sampled LRU evicts blocks never hit before the blocks hit since start, and
    its capacity holds."""
    store = make_store(host=0, disk=100)
    hashes, data = blocks(90)
    store.put("m", hashes, data)
    store.close()
    again = make_store(host=0, disk=100, register=False)
    hot = hashes[:10]
    for _ in range(3):
        assert again.get("m", hot) == data[:10]
    more, more_data = blocks(60)
    for i in range(0, 60, 5):
        again.put("m", more[i:i + 5], more_data[i:i + 5])
        again.check_integrity()
    assert again.get("m", hot) == data[:10]
    assert again.lookup("m", more[-5:]).prefix_blocks == 5
    disk = again.stats().tiers["disk"]
    assert disk.bytes <= disk.capacity_bytes and disk.evictions > 0


def test_a_put_batch_asks_the_disk_file_once_for_all_its_blocks(
    make_store: StoreFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reserving a batch finds the blocks only the disk holds (skipped, like those in RAM)
    with one read of the disk's index for the whole batch, not one per block."""
    make_store(host=0, disk=4).close()  # registers the namespace in ns.json
    on_disk = _fill_disk(tmp_path, 3, size=BLOCK)
    store = make_store(host=8, disk=64, register=False)
    in_ram, ram_data = blocks(1)
    store.put("m", in_ram, ram_data)
    new = blocks(3)[0]
    asked: list[int] = []
    metas = DiskTier.metas
    monkeypatch.setattr(DiskTier, "metas", lambda tier, keys: asked.append(len(keys))
                        or metas(tier, keys))
    batch = [new[0], on_disk[0], in_ram[0], new[1], on_disk[1], new[0], on_disk[2], new[2]]
    extents = store.reserve_write("m", batch, owner="w").extents
    assert [ext is not None for ext in extents] == [True, False, False, True, False, False,
                                                    False, True]
    assert asked == [6]  # the distinct keys not in RAM, in one read
    assert store.commit_write("m", batch, owner="w").stored == 3
    store.check_integrity()
