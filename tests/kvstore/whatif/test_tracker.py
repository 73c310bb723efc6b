"""The tracker as the store will feed it: bounded keys (fixed-size SHARDS), reset, scopes per
namespace and tenant, sizes in bytes, demotions, the observed rate and the wire form."""

from __future__ import annotations

import json

import pytest

from kvstore.protocol.whatif import WhatIfOut
from kvstore.whatif import WhatIfConfig, WhatIfTracker, replay
from tests.kvstore.whatif.traces import cyclic, feed, hashes, uniform, zipf

SIZE = 4096


def test_tracked_keys_never_pass_the_bound_and_the_rate_falls_to_match() -> None:
    t = WhatIfTracker("host", 1_000 * SIZE, "s3fifo",
                      WhatIfConfig(sample_rate=1.0, max_keys=256))
    trace = hashes(zipf(50_000, 60_000, alpha=0.6))
    most = 0
    for i in range(0, len(trace), 16):
        t.access_many("ns", trace[i:i + 16], SIZE)
        most = max(most, t.tracked_keys)
    assert most <= 256
    distinct = len(set(trace))
    assert 0.5 < t.sample_rate / (256 / distinct) < 1.1  # about bound / distinct blocks
    curve = t.curve()
    assert curve.sample_rate == t.sample_rate and curve.sampled > 0
    assert all(0.0 <= p.hit_rate <= 1.0 for p in curve.points)


def test_a_bounded_tracker_stays_close_to_the_unbounded_one() -> None:
    trace = hashes(zipf(40_000, 150_000, alpha=0.8))
    free = WhatIfTracker("host", 2_000 * SIZE, config=WhatIfConfig(sample_rate=0.2,
                                                                    max_keys=None))
    bounded = WhatIfTracker("host", 2_000 * SIZE,
                            config=WhatIfConfig(sample_rate=0.2, max_keys=2_000))
    feed(free, trace, SIZE)
    feed(bounded, trace, SIZE)
    assert bounded.tracked_keys <= 2_000 < free.tracked_keys
    for a, b in zip(free.curve().points, bounded.curve().points, strict=True):
        assert a.hit_rate == pytest.approx(b.hit_rate, abs=0.05)


def test_reset_forgets_everything_and_restores_the_rate() -> None:
    t = WhatIfTracker("host", 100 * SIZE, "lfu", WhatIfConfig(sample_rate=0.5, max_keys=64))
    feed(t, hashes(cyclic(1_000, 2)), SIZE)
    assert t.sample_rate < 0.5 and t.tracked_keys
    t.reset()
    assert t.sample_rate == 0.5 and t.tracked_keys == 0 and t.namespaces() == []
    curve = t.curve()
    assert curve.accesses == 0 and all(p.hit_rate == 0.0 for p in curve.points)
    feed(t, hashes(cyclic(50, 4)), SIZE)  # works again from scratch
    assert t.curve().current.hit_rate == pytest.approx(0.75, abs=0.1)


def test_namespace_and_tenant_scopes_add_up_to_the_tier() -> None:
    """``a`` rereads 100 blocks, ``b`` never rereads: in a tier of 400 blocks ``a`` hits all
    but its first pass, ``b`` never; the tier is their mix; a tenant's scope is the sum of
    its namespaces."""
    t = WhatIfTracker("host", 400 * SIZE, config=WhatIfConfig(sample_rate=1.0))
    loop, once = hashes(cyclic(100, 10)), hashes(list(range(10**6, 10**6 + 1_000)))
    for i in range(10):
        t.access_many("a", loop[i * 100:(i + 1) * 100], SIZE)
        t.access_many("b", once[i * 100:(i + 1) * 100], SIZE)
    assert t.curve(["a"]).current.hit_rate == pytest.approx(0.9)
    assert t.curve(["b"]).current.hit_rate == 0.0
    assert t.curve().current.hit_rate == pytest.approx(0.45)
    assert t.curve(["a", "b"]).points == t.curve().points
    assert t.curve(["a", "nobody"]).points == t.curve(["a"]).points
    # in a tier of 100 blocks the scan of b pushes a's blocks out: a shared tier
    assert t.curve(["a"]).points[0].hit_rate == 0.0


def test_the_same_hash_in_two_namespaces_is_two_blocks() -> None:
    t = WhatIfTracker("host", 100 * SIZE, config=WhatIfConfig(sample_rate=1.0))
    same = hashes(cyclic(100, 4))
    for i in range(4):
        t.access_many("a", same[i * 100:(i + 1) * 100], SIZE)
        t.access_many("b", same[i * 100:(i + 1) * 100], SIZE)
    # 200 distinct blocks in a loop: a tier of 100 misses them all, of 200 (2x) hits all but
    # the first pass
    curve = t.curve()
    assert curve.current.hit_rate == 0.0
    assert curve.at(200 * SIZE) == pytest.approx(0.75)
    assert t.tracked_keys == 200


def test_distances_are_in_bytes_across_block_sizes() -> None:
    """100 small blocks and 100 blocks four times larger, read in one loop: the tier needs
    all 500 small-block units."""
    t = WhatIfTracker("host", 500 * SIZE, config=WhatIfConfig(sample_rate=1.0))
    small, large = hashes(range(100)), hashes(range(100), b"large")
    for _ in range(5):
        t.access_many("small", small, SIZE)
        t.access_many("large", large, 4 * SIZE)
    curve = t.curve()
    assert all(p.hit_rate == 0.0 for p in curve.points if p.capacity_bytes < 500 * SIZE)
    assert curve.current.hit_rate == pytest.approx(0.8)


def test_demotions_refresh_recency_without_counting_as_requests() -> None:
    t = WhatIfTracker("disk", 100 * SIZE, "s3fifo", WhatIfConfig(sample_rate=1.0))
    blocks = hashes(range(100))
    t.insert_many("ns", blocks, SIZE)  # demoted into the tier
    for policy in ("lru", "s3fifo"):
        assert t.curve(policy=policy).accesses == 0
    t.access_many("ns", blocks, SIZE)  # then read: hits wherever the 100 fit
    for policy in ("lru", "s3fifo"):
        curve = t.curve(policy=policy)
        assert curve.accesses == 100 and curve.current.hit_rate == 1.0
        assert curve.points[0].hit_rate == 0.0  # 25 blocks: the loop misses


def test_forget_namespace_drops_its_keys_from_every_part() -> None:
    t = WhatIfTracker("host", 100 * SIZE, "lfu", WhatIfConfig(sample_rate=1.0))
    feed(t, hashes(range(50)), SIZE, namespace="gone")
    feed(t, hashes(range(50), b"kept"), SIZE, namespace="kept")
    t.forget_namespace("gone")
    assert t.tracked_keys == 50 and t.namespaces() == ["kept"]
    assert t.curve(["gone"]).accesses == 0
    feed(t, hashes(range(50), b"kept"), SIZE, namespace="kept")
    assert t.curve().current.hit_rate == pytest.approx(0.5)


def test_observed_hit_rate_is_what_the_feeder_said() -> None:
    t = WhatIfTracker("host", 100 * SIZE)
    t.access_many("ns", hashes(range(4)), SIZE, hits=[True, False, True, True])
    t.access("ns", hashes([9])[0], SIZE)  # no outcome given: not judged
    assert t.curve().observed_hit_rate == 0.75
    assert WhatIfTracker("host", SIZE).curve().observed_hit_rate is None


def test_memory_estimate_grows_with_the_tracked_keys_only() -> None:
    t = WhatIfTracker("host", 1_000 * SIZE, config=WhatIfConfig(sample_rate=1.0, max_keys=4_096))
    feed(t, hashes(uniform(2_000, 4_000)), SIZE)
    small = t.nbytes()
    feed(t, hashes(range(10**6, 10**6 + 50_000)), SIZE)
    assert t.tracked_keys <= 4_096
    assert t.nbytes() < 4 * small


def test_config_is_validated() -> None:
    for bad in ({"sample_rate": 0.0}, {"sample_rate": 1.5}, {"max_keys": 3}, {"points": 1},
                {"low": 2.0, "high": 1.0}, {"fill": 0.0}, {"policies": ("nope",)}):
        with pytest.raises(ValueError):
            WhatIfConfig(**bad)  # type: ignore[arg-type]
    grid = WhatIfConfig().capacities(1 << 30)
    assert len(grid) == 17 and grid[0] == 1 << 28 and grid[-1] == 1 << 32
    assert {1 << 29, 1 << 30, 1 << 31} <= set(grid)  # 0.5x, 1x, 2x are points


def test_wire_form_round_trips() -> None:
    t = WhatIfTracker("host", 100 * SIZE, "s3fifo", WhatIfConfig(sample_rate=1.0))
    feed(t, hashes(cyclic(50, 3)), SIZE)
    out = WhatIfOut.from_curve(t.curve(["ns"]))
    doc = json.loads(out.model_dump_json())
    assert doc["tier"] == "host" and doc["policy"] == "s3fifo" and doc["method"] == "mini"
    assert len(doc["points"]) == 17 and doc["namespaces"] == ["ns"]
    assert doc["current"] == {"capacity_bytes": 100 * SIZE, "hit_rate": pytest.approx(2 / 3)}
    assert WhatIfOut.model_validate(doc) == out


def test_fill_models_a_tier_that_keeps_below_its_capacity() -> None:
    """A tier that evicts down to half its capacity (``fill`` 0.5): each point is the exact
    replay at half its capacity, labelled with the capacity itself (LRU within the
    histogram's resolution: a bin 1.5% wide can hold two distances a block apart)."""
    t = WhatIfTracker("host", 200 * SIZE, "s3fifo", WhatIfConfig(sample_rate=1.0, fill=0.5))
    trace = hashes(zipf(2_000, 8_000))
    feed(t, trace, SIZE)
    keys, sizes = [("ns", h) for h in trace], [SIZE] * len(trace)
    for policy in ("lru", "s3fifo"):
        curve = t.curve(policy=policy)
        assert curve.current.capacity_bytes == 200 * SIZE
        for capacity, rate in curve.points[::4]:
            exact = sum(replay(policy, keys, sizes, round(capacity * 0.5))) / len(keys)
            assert rate == pytest.approx(exact, abs=5e-3 if policy == "lru" else 1e-12)
