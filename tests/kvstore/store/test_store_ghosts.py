"""The ghost record: the last blocks to leave the store, with when, from which tier and why;
bounded, and read by ``Store.trace`` beside where the blocks still stored are."""

from __future__ import annotations

import time
from pathlib import Path

import lmdb
import pytest

from kvstore.namespace import Layout, Namespace
from kvstore.store.ghosts import Ghosts

from .conftest import BLOCK, NS, StoreFactory, blocks


def test_ghost_record_keeps_the_most_recent_departures_up_to_its_capacity() -> None:
    ghosts = Ghosts(3)
    keys = [("m", bytes([i]) * 32) for i in range(5)]
    ghosts.record(keys[:2], "host", "evicted")
    ghosts.record(keys[2:], "disk", "deleted")
    assert len(ghosts) == 3
    assert ghosts.get(keys[0]) is None and ghosts.get(keys[1]) is None  # oldest forgotten
    assert [ghosts.get(k).tier for k in keys[2:]] == ["disk"] * 3  # type: ignore[union-attr]
    ghosts.record([keys[2]], "host", "corrupt")  # a key recorded again is the newest
    ghosts.record([keys[0]], "host", "evicted")
    assert ghosts.get(keys[3]) is None and ghosts.get(keys[2]).why == "corrupt"  # type: ignore[union-attr]
    assert len(ghosts) == 3

    ghosts.forget_namespace("m")
    assert len(ghosts) == 0
    off = Ghosts(0)
    off.record(keys, "host", "evicted")
    assert len(off) == 0 and off.get(keys[0]) is None
    with pytest.raises(ValueError):
        Ghosts(-1)


def test_trace_names_every_tier_and_the_ghost_of_an_evicted_block(
        make_store: StoreFactory) -> None:
    """No disk tier: blocks pushed out of a full host tier leave the store, and their ghosts
    say when and from which tier."""
    store = make_store(host=4, disk=0)
    hashes, data = blocks(12)
    before = time.time()
    store.put("m", hashes, data)
    trace = store.trace("m", hashes)
    gone = [i for i, t in enumerate(trace.tiers) if not t]
    assert gone and gone[0] == 0  # LRU: the first ones went
    for i in range(12):
        ghost = trace.ghosts[i]
        if i in gone:
            assert ghost is not None and ghost.why == "evicted" and ghost.tier == "host"
            assert before <= ghost.at <= time.time()
        else:
            assert ghost is None and trace.tiers[i] == ["host"]
    assert trace.ghosts_kept == len(gone) and trace.ghost_capacity == 65536
    store.check_integrity()


def test_trace_lists_every_tier_holding_a_block_top_first(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64, disk_write_through=True)
    hashes, data = blocks(2)
    store.put("m", hashes, data)
    assert store.trace("m", hashes).tiers == [["host", "disk"], ["host", "disk"]]


def test_deleted_blocks_leave_ghosts_naming_their_top_tier(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(3)
    store.put("m", hashes[:2], data[:2])
    store.put("m", hashes[2:], data[2:], tier="disk")
    store.pin("m", hashes[:1])  # a pinned block's host slots are retired: still a ghost
    assert store.delete("m", hashes) == 3
    trace = store.trace("m", hashes)
    assert trace.tiers == [[], [], []]
    assert [(g.tier, g.why) for g in trace.ghosts if g is not None] == [
        ("host", "deleted"), ("host", "deleted"), ("disk", "deleted")]
    store.check_integrity()


def test_a_deleted_namespace_takes_its_ghosts_with_it(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=0)
    hashes, data = blocks(8)
    store.put("m", hashes, data)
    assert store.trace("m", hashes).ghosts_kept > 0
    store.delete_namespace("m")
    store.register_namespace(NS)
    trace = store.trace("m", hashes)
    assert trace.ghosts == [None] * 8 and trace.ghosts_kept == 0


def test_a_corrupt_block_leaves_a_ghost(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(host=2, disk=64)
    hashes, data = blocks(4)
    store.put("m", hashes, data)
    store.close()
    env = lmdb.open(str(tmp_path / "lmdb"), subdir=True, max_dbs=0, lock=True)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(b"m\x00" + hashes[0]))
        value[-1] ^= 0xFF
        txn.put(b"m\x00" + hashes[0], bytes(value))
    env.close()
    again = make_store(host=2, disk=64, register=False)
    assert again.get("m", hashes[:1]) == [None]
    ghost = again.trace("m", hashes[:1]).ghosts[0]
    assert ghost is not None and (ghost.tier, ghost.why) == ("disk", "corrupt")


def test_no_ghosts_when_the_record_is_off(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=0, ghost_entries=0)
    hashes, data = blocks(12)
    store.put("m", hashes, data)
    trace = store.trace("m", hashes)
    assert trace.ghosts == [None] * 12 and trace.ghost_capacity == 0


def test_trace_of_an_unknown_namespace_or_a_bad_hash_raises(make_store: StoreFactory) -> None:
    from kvstore.errors import InvalidHashError, UnknownNamespaceError

    store = make_store(host=4, disk=0)
    with pytest.raises(UnknownNamespaceError):
        store.trace("nope", [b"x" * 32])
    with pytest.raises(InvalidHashError):
        store.trace("m", [b""])
    other = Namespace("o", BLOCK, Layout(block_size=16))
    store.register_namespace(other)
    assert store.trace("o", []).tiers == []
