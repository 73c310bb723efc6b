"""Fencing of the shared-memory path in the store: a commit that names the generation its
extents were handed out with is refused once those slots were freed (and maybe reused) since,
so a late writer's bytes never become a block."""

from __future__ import annotations

import time

import pytest

from kvstore.errors import StaleStagingError
from tests.kvstore.store.conftest import NS, StoreFactory, blocks


def test_a_commit_after_the_lease_ran_out_is_refused_by_generation(
        make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=0)
    late, _ = blocks(1)
    ext, gens = store.reserve_write(NS.name, late, lease_s=0.05, owner="late")
    time.sleep(0.1)
    store.expire_leases()  # the reservation runs out: its slots are free again
    # The same client reserves the same block again (a retry): same slots, a new generation.
    again, again_gens = store.reserve_write(NS.name, late, lease_s=30, owner="late")
    assert again == ext and again_gens != gens
    # The late commit names the old generation: refused, even though the key is reserved.
    assert store.commit_write(NS.name, late, owner="late", gens=gens).refused == 1
    assert store.commit_write(NS.name, late, owner="late", gens=again_gens).stored == 1


def test_generations_move_when_slots_are_freed_and_reused(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=0)
    hashes, data = blocks(4)
    store.put(NS.name, hashes, data)
    ext, gens, _ = store.acquire_read(NS.name, hashes, lease_s=0.05, owner="r")
    time.sleep(0.1)
    store.expire_leases()
    store.delete(NS.name, hashes)
    others, other_data = blocks(4)
    store.put(NS.name, others, other_data)
    reused = store.acquire_read(NS.name, others, owner="r2").extents
    assert sorted(e[0][0] for e in reused if e) == sorted(e[0][0] for e in ext if e)
    now = store.tier("host").generations(ext)
    assert any(g is not None for g in gens)
    assert all(a != b for a, b in zip(now, gens, strict=True) if b is not None)


def test_a_staged_place_dropped_and_staged_again_is_another_place(
        make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=0)
    places, gens = store.stage_write(NS.name, 1, owner="w")
    store.expire_leases("w")  # the owner's connections closed: its places go
    again, again_gens = store.stage_write(NS.name, 1, owner="w")  # it reconnects: same slot
    assert again == places
    hashes, _ = blocks(1)
    with pytest.raises(StaleStagingError):
        store.commit_staged(NS.name, hashes, [places[0][0][0]], owner="w", gens=gens)
    result, used = store.commit_staged(NS.name, hashes, [places[0][0][0]], owner="w",
                                       gens=again_gens)
    assert result.stored == 1 and used == [places[0][0][0]]
