"""A block granted to a reader (``acquire_read``: pinned host-slab extents) keeps its slots
until the pin ends, whatever else writes a copy of it meanwhile.

Two readers depend on that: a shared-memory client copies at the extents and checks the
generation that came with them (read as they were pinned: ``Fenced``), and a socket get
served from the slab (``server/dataplane/direct_get.py``) sends views of the pinned slots
with no generation at all. A second copy of a held block written into the host tier
(``SlabTier.put_many`` replaces a stored key whatever its pins) frees the granted slots, and
in a batch they go back out to the batch's other blocks: the socket reader then sends another
block's bytes for its own, and the shared-memory one misses (or, with a generation read after
the copy, as the server once did, takes them too). So the store never writes a copy of a
block over one the tier holds (``Placer.copy_batch``).

Each test leaves a free slot below the granted ones on top of the slab's free list (a block
deleted just before), so that a replacing batch is handed its slots in another order: what
the host tier of a busy server, which evicts as it promotes, does all the time.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from kvstore.store import Store
from kvstore.store.index import make_keys
from kvstore.tiers.base import BlockMeta

from .conftest import NS, StoreFactory, blocks, fenced_copy, slab_copy


def _disk_only(store: Store, n: int) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """``n`` blocks stored on disk only (hashes, bytes), and before them one block put in
    the host tier's first slot (its hash): deleting it later frees a slot below the ones
    the disk blocks are promoted into."""
    low, low_data = blocks(1)
    store.put(NS.name, low, low_data)
    hashes, data = blocks(n)
    assert store.put(NS.name, hashes, data, tier="disk").stored == n
    assert store.lookup(NS.name, hashes).tiers == ["disk"] * n
    return hashes, data, low


def _hold_late_disk_reads(store: Store, monkeypatch: pytest.MonkeyPatch,
                          ) -> tuple[threading.Event, threading.Event]:
    """Hold the disk reads of the thread named ``late``, once read, until ``go`` is set."""
    disk = store.tier("disk")
    real = disk.get_many
    entered, go = threading.Event(), threading.Event()

    def held(keys: Sequence[Any]) -> list[bytes | None]:
        out = real(keys)
        if threading.current_thread().name == "late":
            entered.set()
            assert go.wait(10)
        return out

    monkeypatch.setattr(disk, "get_many", held)
    return entered, go


def test_a_second_promotion_of_a_granted_block_leaves_its_slots_alone(
        make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two shared-memory reads of the same disk-only blocks, both read from disk before
    either promotes: the later promotion must not copy again what the earlier one granted."""
    store = make_store(host=8, disk=64)
    hashes, data, low = _disk_only(store, 5)
    entered, go = _hold_late_disk_reads(store, monkeypatch)
    late = threading.Thread(name="late", daemon=True, target=lambda: store.acquire_read(
        NS.name, hashes[1:], owner="late"))
    late.start()
    assert entered.wait(10)  # it found hashes[1:] on disk only, and read them

    granted, at_grant, _ = store.acquire_read(NS.name, hashes[:4], owner="reader")  # pinned
    assert store.delete(NS.name, low) == 1
    go.set()
    late.join(10)
    assert not late.is_alive()

    # The late promotion landed after the grant: the granted slots must still hold the
    # granted blocks, under the generations handed out with them (no needless miss).
    for i, ext in enumerate(granted):
        assert ext is not None
        assert fenced_copy(store, ext, at_grant[i]) == data[i], f"block {i}: other bytes"
    assert store.tier("host").generations(granted) == at_grant  # not replaced at all
    store.check_integrity()


@pytest.mark.parametrize("generation_read", ["before", "after"])
def test_a_copy_of_a_granted_block_is_never_written_over_its_slots(
        make_store: StoreFactory, generation_read: str) -> None:
    """Any path that writes a copy of an indexed block into a tier goes through
    ``Placer.copy_batch``: asked to copy granted blocks into the host tier again, it must
    leave their slots alone (a socket get sending the pinned slots has no generation to
    check) or at least fence the grant (a shared-memory reader then sees a miss), whether
    the reader's generation is the grant's or one read after the copy landed."""
    store = make_store(host=8, disk=64)
    hashes, data, low = _disk_only(store, 4)
    granted, at_grant, _ = store.acquire_read(NS.name, hashes[:3], owner="reader")
    gens = at_grant if generation_read == "before" else None
    assert store.delete(NS.name, low) == 1

    keys = make_keys(NS.name, hashes)
    host = store.tier_names().index("host")
    with store._lock:
        entries = store._ledger.get_many(keys)
        items = [(k, d, BlockMeta(e.layout_id, e.checksum, e.size))
                 for k, d, e in zip(keys, data, entries, strict=True) if e is not None]
        assert store._placer.copy_batch(host, items) == set()
    if gens is None:
        gens = store.tier("host").generations(granted)

    for i, ext in enumerate(granted):
        assert ext is not None
        assert fenced_copy(store, ext, gens[i]) in (data[i], None), f"block {i}: other bytes"
        assert slab_copy(store, ext) == data[i], f"block {i}: its pinned slots were given away"
    assert store.get(NS.name, hashes) == data
    store.check_integrity()
