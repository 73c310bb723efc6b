"""Leases are bounded: every pinning call is cut to ``max_lease_s`` and
refuses a lease that is not a finite, positive number; pins taken for a tenant count against
its quota of pinned bytes, all or nothing; ``cut_leases`` shortens one owner's pins."""

from __future__ import annotations

import math
import time

import pytest

from kvstore.errors import InvalidLeaseError, PinQuotaError
from tests.kvstore.store.conftest import BLOCK, NS, StoreFactory, blocks

FULL = (1.0, 1.0)  # watermarks: the host tier evicts only when a put needs the room


def test_a_lease_past_max_lease_s_is_cut_to_it(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=0, host_watermarks=FULL, default_lease_s=0.1,
                       max_lease_s=0.2)
    hashes, data = blocks(4)
    store.put(NS.name, hashes, data)
    assert store.pin(NS.name, hashes[:2], lease_s=1e7, owner="p") == [True, True]
    assert all(store.acquire_read(NS.name, hashes[2:], lease_s=1e7, owner="r").extents)
    time.sleep(0.3)
    # every pin ran out after max_lease_s: all four blocks can be evicted for new ones
    assert store.put(NS.name, *blocks(4)).stored == 4
    assert store.get(NS.name, hashes, promote=False) == [None] * 4
    late, _ = blocks(1)
    assert store.reserve_write(NS.name, late, lease_s=1e7, owner="w").extents[0] is not None
    time.sleep(0.3)
    store.expire_leases()
    assert store.commit_write(NS.name, late, owner="w").refused == 1  # reservation freed too
    store.check_integrity()


@pytest.mark.parametrize("bad", [-1.0, 0.0, math.nan, math.inf, -math.inf])
def test_a_lease_that_is_not_finite_and_positive_is_refused(make_store: StoreFactory,
                                                            bad: float) -> None:
    store = make_store(host=4, disk=0)
    hashes, data = blocks(2)
    store.put(NS.name, hashes, data)
    with pytest.raises(InvalidLeaseError, match="finite, positive"):
        store.pin(NS.name, hashes, lease_s=bad)
    with pytest.raises(InvalidLeaseError):
        store.acquire_read(NS.name, hashes, lease_s=bad)
    with pytest.raises(InvalidLeaseError):
        store.reserve_write(NS.name, blocks(1)[0], lease_s=bad)
    assert store.stats().totals.pinned == 0


def test_the_config_refuses_a_default_lease_past_the_cap(make_store: StoreFactory) -> None:
    with pytest.raises(ValueError, match="max_lease_s"):
        make_store(default_lease_s=60.0, max_lease_s=30.0)
    with pytest.raises(ValueError, match="max_lease_s"):
        make_store(max_lease_s=math.inf)


def test_a_tenant_past_its_quota_is_refused_and_pins_nothing(make_store: StoreFactory) -> None:
    store = make_store(host=16, disk=0, max_pinned_bytes_per_tenant=3 * BLOCK)
    hashes, data = blocks(8)
    store.put(NS.name, hashes, data)
    assert store.pin(NS.name, hashes[:2], owner="a/1", tenant="a") == [True, True]
    # two new blocks would make four: refused whole, the block it already holds included
    with pytest.raises(PinQuotaError, match=r"tenant 'a'.*max_pinned_bytes_per_tenant"):
        store.pin(NS.name, hashes[1:4], owner="a/1", tenant="a")
    assert store.release(NS.name, hashes[2:4], owner="a/1") == 0  # nothing half-pinned
    assert store.release(NS.name, hashes[1:2], owner="a/1") == 1  # only the first pin
    assert store.pin(NS.name, hashes[1:2], owner="a/1", tenant="a") == [True]
    with pytest.raises(PinQuotaError):  # reads through shared memory are charged as well
        store.acquire_read(NS.name, hashes[4:6], owner="a/1#read", tenant="a")
    assert store.release(NS.name, hashes[4:6], owner="a/1#read") == 0
    # a block counts once per tenant, however many of its clients pin it, however often
    assert store.pin(NS.name, [hashes[0]] * 2, owner="a/2", tenant="a") == [True, True]
    assert store.pin(NS.name, hashes[2:3], owner="a/2", tenant="a") == [True]
    # another tenant, and the admin (no tenant), are not limited by a's pins
    assert store.pin(NS.name, hashes[:3], owner="b/1", tenant="b") == [True] * 3
    assert store.pin(NS.name, hashes, owner="admin") == [True] * 8
    # releasing gives the bytes back (block 0 stays charged: a/2 still pins it)
    assert store.release(NS.name, hashes[:2], owner="a/1") == 2
    assert store.pin(NS.name, hashes[3:4], owner="a/1", tenant="a") == [True]
    with pytest.raises(PinQuotaError):
        store.pin(NS.name, hashes[4:5], owner="a/1", tenant="a")
    store.check_integrity()


def test_expired_and_deleted_pins_give_their_bytes_back(make_store: StoreFactory) -> None:
    store = make_store(host=16, disk=0, max_pinned_bytes_per_tenant=2 * BLOCK)
    hashes, data = blocks(6)
    store.put(NS.name, hashes, data)
    store.pin(NS.name, hashes[:2], lease_s=0.05, owner="a/1", tenant="a")
    time.sleep(0.1)  # ran out, and no reaper has dropped them yet
    assert store.pin(NS.name, hashes[2:4], owner="a/1", tenant="a") == [True, True]
    assert store.delete(NS.name, hashes[2:4]) == 2
    assert store.pin(NS.name, hashes[4:6], owner="a/1", tenant="a") == [True, True]
    store.check_integrity()


def test_cut_leases_shortens_one_owners_pins(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=0, host_watermarks=FULL)
    hashes, data = blocks(4)
    store.put(NS.name, hashes, data)
    store.pin(NS.name, hashes[:3], lease_s=60, owner="gone#grant")
    store.pin(NS.name, hashes[3:], lease_s=60, owner="other")
    assert store.cut_leases("gone#grant", 0.05) == 3
    assert store.cut_leases("gone#grant", 30) == 0  # never lengthens
    time.sleep(0.1)
    assert store.put(NS.name, *blocks(3)).stored == 3  # the cut pins no longer hold
    assert store.lookup(NS.name, hashes[3:]).tiers == ["host"]  # the other owner's do
