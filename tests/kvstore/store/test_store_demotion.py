"""Demotion in batches: victims leave a full tier with one read from it and one write into
the tier below (one LMDB transaction per batch), and nothing is lost or double-counted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from .conftest import BLOCK, StoreFactory, blocks


def _count_calls(monkeypatch: pytest.MonkeyPatch, tier: Any, name: str) -> list[int]:
    """Record the batch size of every call of ``tier.name``."""
    sizes: list[int] = []
    real = getattr(tier, name)

    def counted(items: Sequence[Any]) -> Any:
        sizes.append(len(items))
        return real(items)

    monkeypatch.setattr(tier, name, counted)
    return sizes


def test_a_batch_of_victims_goes_down_in_one_disk_write(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(host=16, disk=256, host_watermarks=(0.99, 1.0))
    old_h, old_d = blocks(16)
    store.put("m", old_h, old_d)  # the host tier is full
    disk_puts = _count_calls(monkeypatch, store.tier("disk"), "put_many")
    host_reads = _count_calls(monkeypatch, store.tier("host"), "get_many")
    new_h, new_d = blocks(12)
    store.put("m", new_h, new_d)  # makes room for 12 blocks at once
    assert disk_puts == [12]
    assert host_reads == [12]
    stats = store.stats()
    assert stats.tiers["host"].demotions == stats.tiers["host"].evictions == 12
    assert stats.totals.dropped == 0
    store.check_integrity()
    assert store.get("m", old_h + new_h, promote=False) == old_d + new_d


def test_a_batch_the_lower_tier_cannot_take_whole_goes_one_by_one(
    make_store: StoreFactory
) -> None:
    # 6 victims but room below for 4: the 4 that fit are kept, the rest are dropped
    store = make_store(host=8, disk=4, host_watermarks=(0.99, 1.0))
    old_h, old_d = blocks(8)
    store.put("m", old_h, old_d)
    new_h, new_d = blocks(6)
    store.put("m", new_h, new_d)
    store.check_integrity()
    stats = store.stats()
    assert stats.tiers["host"].evictions >= 6
    kept = [g for g in store.get("m", old_h, promote=False) if g is not None]
    assert len(kept) == 8 - stats.totals.dropped
    assert all(g in old_d for g in kept)
    assert store.tier("disk").used_bytes() <= 4 * BLOCK


def test_demotion_from_disk_to_nothing_does_not_read_the_victims(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(host=0, disk=8)
    old_h, old_d = blocks(8)
    store.put("m", old_h, old_d)
    disk_reads = _count_calls(monkeypatch, store.tier("disk"), "get_many")
    new_h, new_d = blocks(4)
    store.put("m", new_h, new_d)
    assert disk_reads == []  # the bottom tier drops its victims without reading them
    assert store.stats().totals.dropped >= 4
    store.check_integrity()
    assert store.get("m", new_h) == new_d
