"""Receiving reservations (kvstore/store/reservations.py): places the server fills itself
(``reserve_write(receiving=True)``) are never freed under their writer. A namespace delete,
the lease running out or the owner's leases dropped only doom them: the block never becomes
visible, the key is free for others at once, and the slots go back to the free list at the
writer's own commit or abort, each exactly once."""

from __future__ import annotations

import time

import pytest

from kvstore.namespace import Layout, Namespace
from kvstore.store import Store
from kvstore.store.report import IntegrityError
from kvstore.types import BlockHash
from tests.kvstore.store.conftest import BLOCK, NS, StoreFactory
from tests.kvstore.store.conftest import blocks as random_blocks

OTHER = Namespace("other", BLOCK, Layout(model_id="tiny", num_layers=2, block_size=16,
                                         dtype="f32"))


def blocks(n: int) -> tuple[list[BlockHash], list[bytes]]:
    hashes, data = random_blocks(n)
    return [BlockHash(h) for h in hashes], data


def _used(store: Store) -> int:
    return store.tier("host").used_bytes()


def _write(store: Store, extents: list[list[tuple[int, int]] | None], byte: int) -> None:
    """What the receiving writer does: its bytes land in its places."""
    host = store.tier("host")
    for ext in extents:
        for off, n in ext or []:
            host.view(off, n)[:] = bytes([byte]) * n  # type: ignore[attr-defined]


def test_namespace_delete_dooms_a_receive_and_never_hands_its_slots_to_another_block(
        make_store: StoreFactory) -> None:
    store = make_store(host=16, disk=0)
    store.register_namespace(OTHER)
    mine, _ = blocks(4)
    extents = store.reserve_write(NS.name, mine, lease_s=60, owner="recv",
                                  receiving=True).extents
    _write(store, extents[:1], 0xAA)  # the receive has started
    store.delete_namespace(NS.name)
    store.check_integrity()
    assert _used(store) == 4 * BLOCK  # doomed, still held: the receive goes on
    theirs, data = blocks(4)
    assert store.put(OTHER.name, theirs, data).stored == 4  # into other slots
    _write(store, extents, 0xAA)  # the rest of the receive lands
    assert store.get(OTHER.name, theirs) == data
    store.register_namespace(NS)
    result = store.commit_write(NS.name, mine, owner="recv")
    assert (result.stored, result.refused) == (0, 4)
    assert store.get(NS.name, mine) == [None] * 4
    assert _used(store) == 4 * BLOCK  # the commit freed the doomed places
    store.check_integrity()
    assert store.abort_write(NS.name, mine, owner="recv") == 0  # freed once only
    assert _used(store) == 4 * BLOCK


def test_a_plain_reservation_is_still_freed_at_the_delete(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=0)
    hashes, _ = blocks(4)
    store.reserve_write(NS.name, hashes, lease_s=60, owner="shm")
    store.delete_namespace(NS.name)
    assert _used(store) == 0
    store.check_integrity()


@pytest.mark.parametrize("how", ["lease", "owner"])
def test_expiry_dooms_a_receive_and_its_abort_frees_it(make_store: StoreFactory,
                                                       how: str) -> None:
    store = make_store(host=8, disk=0)
    hashes, data = blocks(2)
    store.reserve_write(NS.name, hashes, lease_s=0.05, owner="recv", receiving=True)
    time.sleep(0.1)
    store.expire_leases("recv" if how == "owner" else None)
    store.check_integrity()
    assert _used(store) == 2 * BLOCK
    # the key is free at once: another writer stores the same block in other slots
    assert store.put(NS.name, hashes, data).stored == 2
    assert _used(store) == 4 * BLOCK
    assert store.abort_write(NS.name, hashes, owner="recv") == 2
    assert _used(store) == 2 * BLOCK
    assert store.get(NS.name, hashes) == data  # the abort took nothing of theirs
    result = store.commit_write(NS.name, hashes, owner="recv")  # a commit after the abort
    assert (result.stored, result.existing) == (0, 2)
    store.check_integrity()


def test_a_commit_publishes_what_is_left_and_refuses_what_was_doomed(
        make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=0)
    (short, long_), _ = blocks(2)
    for h, lease in ((short, 0.05), (long_, 60.0)):
        store.reserve_write(NS.name, [h], lease_s=lease, owner="recv", receiving=True)
    ext = store.reserve_write(NS.name, [short, long_], lease_s=60, owner="x").extents
    assert ext == [None, None]  # both reserved: nobody else gets them
    time.sleep(0.1)
    store.expire_leases()
    result = store.commit_write(NS.name, [short, long_], owner="recv")
    assert (result.stored, result.refused) == (1, 1)
    assert _used(store) == BLOCK
    store.check_integrity()


def test_closing_the_store_frees_doomed_places(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=0)
    hashes, _ = blocks(3)
    store.reserve_write(NS.name, hashes, lease_s=60, owner="recv", receiving=True)
    store.delete_namespace(NS.name)
    assert _used(store) == 3 * BLOCK
    store.close()
    assert _used(store) == 0


def test_the_integrity_check_finds_a_reserved_place_nothing_will_free(
        make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=0)
    store.tier("host").reserve((NS.name, b"\x01" * 32), BLOCK)  # type: ignore[attr-defined]
    with pytest.raises(IntegrityError, match="nothing will free"):
        store.check_integrity()
