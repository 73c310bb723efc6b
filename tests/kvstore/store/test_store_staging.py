"""Staged shared-memory writes: anonymous host places, written, then named by their hash."""

from __future__ import annotations

import os

import pytest

from kvstore.errors import StaleStagingError
from kvstore.store import Store

from .conftest import BLOCK, StoreFactory, blocks


def _write(store: Store, places: list[list[tuple[int, int]]], data: list[bytes]) -> list[int]:
    slab = store.host_slab()
    assert slab is not None
    view = store.tier("host").view(0, slab.size)
    for ext, d in zip(places, data, strict=True):
        pos = 0
        for off, n in ext:
            view[off:off + n] = d[pos:pos + n]
            pos += n
    del view
    return [ext[0][0] for ext in places]


def test_staged_places_become_blocks_byte_identical(make_store: StoreFactory) -> None:
    store = make_store(host=32, disk=64)
    places = store.stage_write("m", 3, owner="w").places
    assert len(places) == 3
    assert store.tier("host").used_bytes() == 3 * BLOCK  # charged, invisible
    assert store.stats().totals.blocks == 0
    hashes, data = blocks(3)
    ids = _write(store, places, data)
    result, used = store.commit_staged("m", hashes, ids, owner="w")
    assert result == (3, 0, 0) and used == ids
    assert store.get("m", hashes) == data
    assert store.tier("host").used_bytes() == 3 * BLOCK
    store.check_integrity()


def test_places_of_blocks_already_stored_stay_staged(make_store: StoreFactory) -> None:
    store = make_store(host=32, disk=64)
    hashes, data = blocks(2)
    store.put("m", hashes[:1], data[:1])
    ids = _write(store, store.stage_write("m", 3, owner="w").places, [*data, data[0]])
    result, used = store.commit_staged("m", [*hashes, hashes[1]], ids, owner="w")
    assert result == (1, 2, 0) and used == [ids[1]]  # stored, existing, named twice
    assert store.get("m", hashes) == data
    # the two unused places are still ours: reuse one for a new block
    h, d = [os.urandom(32)], [os.urandom(BLOCK)]
    _write(store, [[(ids[0], BLOCK)]], d)  # one slot per block: the place is one extent
    assert store.commit_staged("m", h, [ids[0]], owner="w")[0].stored == 1
    assert store.get("m", h) == d
    store.check_integrity()


def test_foreign_or_used_places_are_refused_changing_nothing(make_store: StoreFactory) -> None:
    store = make_store(host=16, disk=64)
    hashes, data = blocks(2)
    ids = _write(store, store.stage_write("m", 2, owner="w").places, data)
    with pytest.raises(StaleStagingError):
        store.commit_staged("m", hashes, ids, owner="someone-else")
    with pytest.raises(StaleStagingError):
        store.commit_staged("m", hashes, [ids[0], ids[1] + 1], owner="w")
    assert store.lookup("m", hashes).prefix_blocks == 0
    assert store.commit_staged("m", hashes, ids, owner="w")[0].stored == 2
    with pytest.raises(StaleStagingError):  # used up
        store.commit_staged("m", [os.urandom(32)], ids[:1], owner="w")
    with pytest.raises(ValueError, match="twice"):
        store.commit_staged("m", *blocks(2)[:1], [ids[0], ids[0]], owner="w")
    store.check_integrity()


def test_dropping_the_owner_frees_its_places_and_staging_is_capped(
    make_store: StoreFactory,
) -> None:
    store = make_store(host=16, disk=64)
    assert len(store.stage_write("m", 100, owner="w").places) == 2  # an eighth of 16 blocks
    assert store.stage_write("m", 1, owner="w").places == []
    assert len(store.stage_write("m", 3, owner="x").places) == 2
    assert store.stage_write("m", 1, owner="y").places == []  # all owners: a quarter
    assert store.expire_leases() == 0  # time-based expiry leaves staging alone
    assert store.tier("host").used_bytes() == 4 * BLOCK
    assert store.expire_leases("w") == 2
    assert store.tier("host").used_bytes() == 2 * BLOCK
    assert len(store.stage_write("m", 1, owner="y").places) == 1  # room again
    assert store.expire_leases("x") + store.expire_leases("y") == 3
    assert store.tier("host").used_bytes() == 0
    store.check_integrity()
    ids = _write(store, store.stage_write("m", 1, owner="w").places, blocks(1)[1])
    store.close()  # frees staging too; the placeholder never reaches the disk
    again = make_store(host=8, disk=64, register=False)
    assert again.stats().totals.blocks == 0
    assert ids

