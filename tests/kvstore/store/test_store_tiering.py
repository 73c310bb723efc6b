"""Moving blocks between tiers: demotion, promotion, watermarks, pins, leases, prefetch,
write-through and admission."""

from __future__ import annotations

import os
import time

import pytest

from .conftest import BLOCK, StoreFactory, blocks, fenced_copy


def test_eviction_demotes_instead_of_dropping(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(20)
    for h, d in zip(hashes, data, strict=True):  # one at a time: each put may evict
        store.put("m", [h], [d])
        store.check_integrity()
    assert store.get("m", hashes, promote=False) == data
    stats = store.stats()
    assert stats.tiers["host"].demotions >= 16
    assert stats.totals.dropped == 0
    assert store.tier("host").used_bytes() <= 4 * BLOCK


def test_watermarks_bring_usage_down_to_the_low_mark(make_store: StoreFactory) -> None:
    from kvstore.config import StoreConfig, TierConfig
    from kvstore.store import Store

    from .conftest import NS

    cfg = StoreConfig((
        TierConfig("host", 20 * BLOCK, high_watermark=0.8, low_watermark=0.5,
                   options={"slot_bytes": BLOCK}),
    ))
    with Store(cfg) as store:
        store.register_namespace(NS)
        hashes, data = blocks(17)
        store.put("m", hashes, data)
        used = store.tier("host").used_bytes()
        assert used <= 0.8 * 20 * BLOCK
        store.check_integrity()
        # the last tier drops what it evicts, and says so
        assert store.stats().totals.dropped > 0


def test_last_tier_drops_and_counts(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=0)
    hashes, data = blocks(10)
    store.put("m", hashes, data)
    got = store.get("m", hashes)
    assert got[-1] == data[-1]
    assert sum(g is None for g in got) == store.stats().totals.dropped > 0
    for g, d in zip(got, data, strict=True):
        assert g is None or g == d


def test_hit_in_a_lower_tier_promotes_to_the_top(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(8)
    store.put("m", hashes, data)
    assert store.lookup("m", hashes[:1]).tiers == ["disk"]
    assert store.get("m", hashes[:1]) == data[:1]
    assert store.lookup("m", hashes[:1]).tiers == ["host"]
    assert store.stats().tiers["host"].promotions == 1
    # promote=False leaves it where it is
    assert store.get("m", hashes[1:2], promote=False) == data[1:2]
    assert store.lookup("m", hashes[1:2]).tiers == ["disk"]
    store.check_integrity()


def test_three_tiers_cascade(make_store: StoreFactory) -> None:
    store = make_store(device=2, host=4, disk=64)
    hashes, data = blocks(12)
    for h, d in zip(hashes, data, strict=True):
        store.put("m", [h], [d])
    tiers = store.lookup("m", hashes).tiers
    assert tiers[-1] == "device" and "host" in tiers and tiers[0] == "disk"
    assert store.get("m", hashes) == data
    store.check_integrity()


def test_pinned_blocks_are_never_evicted(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(2)
    store.put("m", hashes, data)
    assert store.pin("m", hashes + [os.urandom(32)], lease_s=60) == [True, True, False]
    more, more_data = blocks(30)
    for h, d in zip(more, more_data, strict=True):
        store.put("m", [h], [d])
    assert store.lookup("m", hashes).tiers == ["host", "host"]
    assert store.release("m", hashes) == 2
    store.put("m", *blocks(4))
    assert "disk" in store.lookup("m", hashes).tiers
    store.check_integrity()


def test_everything_pinned_puts_go_to_the_next_tier_or_are_refused(
    make_store: StoreFactory,
) -> None:
    store = make_store(host=2, disk=0, host_watermarks=(1.0, 1.0))
    hashes, data = blocks(2)
    store.put("m", hashes, data)
    store.pin("m", hashes, lease_s=60)
    result = store.put("m", *blocks(1))
    assert result.refused == 1
    assert store.get("m", hashes) == data

    two = make_store(host=2, disk=16, host_watermarks=(1.0, 1.0))
    two_hashes, two_data = blocks(2)
    two.put("m", two_hashes, two_data)
    two.pin("m", two_hashes, lease_s=60)
    h, d = blocks(1)
    assert two.put("m", h, d).stored == 1
    assert two.lookup("m", h).tiers == ["disk"]


def test_leases_expire(make_store: StoreFactory) -> None:
    store = make_store(host=2, disk=0, host_watermarks=(1.0, 1.0))
    hashes, data = blocks(2)
    store.put("m", hashes, data)
    store.pin("m", hashes, lease_s=0.05)
    time.sleep(0.1)
    assert store.put("m", *blocks(2)).stored == 2  # the expired pins no longer hold them
    assert store.get("m", hashes, promote=False) == [None, None]


def test_expire_leases_of_an_owner(make_store: StoreFactory) -> None:
    store = make_store()
    hashes, data = blocks(3)
    store.put("m", hashes, data)
    store.pin("m", hashes, lease_s=60, owner="client-1")
    store.pin("m", hashes[:1], lease_s=60, owner="client-2")
    assert store.expire_leases(owner="client-1") == 3
    assert store.stats().totals.pinned == 1


def test_prefetch_queues_only_blocks_below_the_top_and_within_its_bound(
        make_store: StoreFactory) -> None:
    from kvstore.errors import BusyError

    store = make_store(host=4, disk=64, max_prefetch_blocks=4)
    hashes, data = blocks(12)
    store.put("m", hashes, data)
    unknown = [os.urandom(32) for _ in range(1000)]  # cost the queue nothing
    assert store.prefetch("m", unknown).result(timeout=10) == 0
    on_top = store.lookup("m", hashes[-2:]).tiers
    assert on_top == ["host", "host"]
    assert store.prefetch("m", hashes[-2:] + unknown).result(timeout=10) == 2
    with pytest.raises(BusyError, match="max_prefetch_blocks"):  # 5 below the top: refused
        store.prefetch("m", hashes[:5])
    assert store.lookup("m", hashes[:5]).tiers == ["disk"] * 5  # nothing was queued
    assert store.prefetch("m", hashes[:2] * 3).result(timeout=10) == 2  # repeats once
    assert store.lookup("m", hashes[:2]).tiers == ["host", "host"]


def test_prefetch_onboards_to_the_top_tier(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(8)
    store.put("m", hashes, data)
    assert store.lookup("m", hashes[:2]).tiers == ["disk", "disk"]
    assert store.prefetch("m", hashes[:2] + [os.urandom(32)]).result(timeout=10) == 2
    assert store.lookup("m", hashes[:2]).tiers == ["host", "host"]
    assert store.stats().totals.prefetched == 2
    assert store.get("m", hashes[:2]) == data[:2]


def test_write_through_keeps_a_disk_copy(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64, disk_write_through=True)
    hashes, data = blocks(3)
    store.put("m", hashes, data)
    assert store.stats().tiers["disk"].blocks == 3
    assert store.tier("disk").get_many([("m", h) for h in hashes]) == data
    store.check_integrity()


def test_admission_seen_twice_guards_the_disk(make_store: StoreFactory) -> None:
    store = make_store(host=2, disk=64, disk_admission="seen_twice")
    once, once_data = blocks(1)
    twice, twice_data = blocks(1)
    store.put("m", once, once_data)
    store.put("m", twice, twice_data)
    assert store.get("m", twice) == twice_data  # second access
    store.put("m", *blocks(4))  # push both out of the host tier
    assert store.get("m", once, promote=False) == [None]  # seen once: not admitted, dropped
    assert store.get("m", twice, promote=False) == twice_data  # demoted to disk
    store.check_integrity()


def test_oversized_blocks_skip_a_tier_they_cannot_fit(make_store: StoreFactory) -> None:
    from kvstore.namespace import Namespace

    store = make_store(host=2, disk=64)
    store.register_namespace(Namespace("big", 3 * BLOCK))
    h, d = [os.urandom(32)], [os.urandom(3 * BLOCK)]
    assert store.put("big", h, d).stored == 1
    assert store.lookup("big", h).tiers == ["disk"]
    assert store.get("big", h) == d


def test_put_naming_a_lower_tier_copies_a_memory_only_block_there(
    make_store: StoreFactory,
) -> None:
    store = make_store(host=8, disk=64)
    hashes, data = blocks(2)
    store.put("m", hashes, data)
    assert store.lookup("m", hashes).tiers == ["host", "host"]
    assert store.put("m", hashes, data, tier="disk").existing == 2
    assert store.tier("disk").get_many([("m", h) for h in hashes]) == data
    assert store.lookup("m", hashes).tiers == ["host", "host"]  # the host copy stays
    store.check_integrity()


@pytest.mark.parametrize("background", [False, True])
def test_a_grant_that_promotes_keeps_its_own_host_blocks(make_store: StoreFactory,
                                                         background: bool) -> None:
    """A read through the slab of a chain whose head is in the host tier (coldest there) and
    whose tail is on disk: the room made for the tail must not evict the head, or a read that
    fits in the tier would fail as if the tier were full of pinned blocks."""
    store = make_store(host=8, disk=64, host_watermarks=(0.9, 1.0),
                       background_demotion=background)
    hashes, data = blocks(6)
    head, tail = (hashes[:3], data[:3]), (hashes[3:], data[3:])
    fill, fill_data = blocks(5)
    store.put("m", *tail)
    store.put("m", *head)
    store.put("m", fill, fill_data)  # the tail, coldest, goes down to make room
    assert store.settled(10)
    before = store.lookup("m", hashes).tiers
    assert before[:3] == ["host"] * 3 and before[3:] == ["disk"] * 3  # the case
    granted, gens, _ = store.acquire_read("m", hashes, owner="reader")
    assert all(g is not None for g in granted)
    for extents, gen, want in zip(granted, gens, data, strict=True):
        assert fenced_copy(store, extents, gen) == want
    store.release("m", hashes, owner="reader")
    assert store.get("m", hashes) == data
    store.check_integrity()
