"""The store's traffic counters: blocks stored by puts, bytes in and out (per namespace, per
tier and in total), and the bytes of the blocks pinned now."""

from __future__ import annotations

from .conftest import BLOCK, StoreFactory, blocks


def test_puts_and_hits_count_blocks_and_bytes(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(6)
    store.put("m", hashes, data)
    store.put("m", hashes[:2], data[:2])  # already there: not stored again
    assert store.get("m", hashes[:4] + [b"\x01" * 32]) == data[:4] + [None]
    doc = store.stats()
    for row in (doc.totals, doc.namespaces["m"]):
        assert row.stored == 6 and row.bytes_in == 6 * BLOCK
        assert row.bytes_out == 4 * BLOCK and row.hits == 4
    assert doc.tiers["host"].bytes_out == 4 * BLOCK
    assert doc.tiers["disk"].bytes_out == 0


def test_staged_shared_memory_puts_count_as_stored(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, _ = blocks(3)
    extents = store.reserve_write("m", hashes, owner="w").extents
    assert all(e is not None for e in extents)
    assert store.commit_write("m", hashes, owner="w").stored == 3
    assert store.stats().namespaces["m"].bytes_in == 3 * BLOCK


def test_pinned_bytes_count_each_block_once(make_store: StoreFactory) -> None:
    store = make_store()
    hashes, data = blocks(3)
    store.put("m", hashes, data)
    store.pin("m", hashes[:2], owner="a")
    store.pin("m", hashes[:2], owner="b")
    totals = store.stats().totals
    assert totals.pinned == 2 and totals.pinned_bytes == 2 * BLOCK
    store.release("m", hashes[:2], owner="a")
    store.release("m", hashes[:2], owner="b")
    assert store.stats().totals.pinned_bytes == 0


def test_prefetch_counts_per_namespace(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(8)
    store.put("m", hashes, data)  # the first four are demoted to disk
    store.prefetch("m", hashes[:2]).result()
    doc = store.stats()
    assert doc.namespaces["m"].prefetched == doc.totals.prefetched == 2
    assert doc.tiers["host"].prefetched == 2
