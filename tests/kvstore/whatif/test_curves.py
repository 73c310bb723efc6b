"""Curves against closed forms and exact replays: LRU from reuse distances, SHARDS_adj, and the
miniature simulations of LFU and S3-FIFO against the real policies at full scale."""

from __future__ import annotations

import pytest

from kvstore.whatif import WhatIfConfig, WhatIfTracker
from tests.kvstore.whatif.traces import cyclic, exact_rates, feed, hashes, mae, uniform, zipf

SIZE = 4096  # bytes per block


def tracker(blocks: int, rate: float, policy: str = "lru", **options: object) -> WhatIfTracker:
    config = WhatIfConfig(sample_rate=rate, **options)  # type: ignore[arg-type]
    return WhatIfTracker("host", blocks * SIZE, policy, config)


def test_cyclic_scan_is_a_step_at_the_loop_size_exactly() -> None:
    """Blocks 0..N-1 read in a loop: LRU misses everything below N blocks and, above, all but
    the first pass."""
    n, passes = 400, 6
    t = tracker(n, 1.0)
    feed(t, hashes(cyclic(n, passes)), SIZE)
    curve = t.curve()
    for capacity, rate in curve.points:
        expected = (passes - 1) / passes if capacity >= n * SIZE else 0.0
        assert rate == pytest.approx(expected), capacity
    assert curve.current == (n * SIZE, pytest.approx((passes - 1) / passes))


@pytest.mark.parametrize("adjust", ["none", "regression", "shards"])
def test_cyclic_scan_sampled_keeps_the_step(adjust: str) -> None:
    """Sampled at 5%, a distance of N blocks reads as N +- 3%: the step stays within 10% of
    N. SHARDS_adj also counts the sample's deviation from 5% of the reads as hits (here no
    block is hot, so that deviation is only noise, within a few percent)."""
    n, passes = 20_000, 5
    t = tracker(n, 0.05, adjust=adjust)
    feed(t, hashes(cyclic(n, passes)), SIZE)
    curve = t.curve()
    slack = 0.005 + (abs(curve.accesses - curve.sampled / 0.05) / curve.accesses
                     if adjust == "shards" else 0.0)
    for capacity, rate in curve.points:
        if capacity <= 0.9 * n * SIZE:
            assert rate <= slack
        elif capacity >= 1.1 * n * SIZE:
            assert rate == pytest.approx((passes - 1) / passes, abs=slack)


def test_uniform_popularity_gives_capacity_over_blocks() -> None:
    """Independent references, uniform over N blocks: LRU's hit rate is C / N (less the first
    reference of each block, N of the L references)."""
    n, length = 20_000, 400_000
    t = tracker(n // 4, 0.05)
    feed(t, hashes(uniform(n, length)), SIZE)
    for capacity, rate in t.curve().points:
        closed = min(1.0, capacity / SIZE / n)
        assert closed - n / length - 0.03 <= rate <= closed + 0.03, capacity


def test_sampled_lru_curve_is_close_to_the_exact_replay() -> None:
    trace = hashes(zipf(60_000, 200_000, alpha=0.8))
    t = tracker(3_000, 0.1)
    feed(t, trace, SIZE)
    pairs = exact_rates("lru", trace, SIZE, t.curve(), every=4)
    assert mae(pairs) <= 0.03, pairs


def test_shards_adj_counts_a_hot_unsampled_block_as_hits() -> None:
    """A hot block outside the sample: without an adjustment its hits are missing from the
    curve; SHARDS_adj brings them back as hits at distance zero."""
    ids = uniform(50_000, 120_000, seed=3)
    trace = hashes(ids)
    hot = next(h for h in (hashes([i], b"hot")[0] for i in range(1000))
               if h[0] >= 0x20)  # never sampled at 10% (below 0x19 99...)
    trace = [hot if i % 3 == 0 else h for i, h in enumerate(trace)]  # a third of the reads
    plain, adjusted = tracker(5_000, 0.1, adjust="none"), tracker(5_000, 0.1, adjust="shards")
    feed(plain, trace, SIZE)
    feed(adjusted, trace, SIZE)
    exact = [e for _, e in exact_rates("lru", trace, SIZE, plain.curve(), every=8)]
    got_plain = [p.hit_rate for p in plain.curve().points[::8]]
    got_adj = [p.hit_rate for p in adjusted.curve().points[::8]]
    assert mae(list(zip(got_adj, exact, strict=True))) <= 0.03
    assert all(p < e - 0.2 for p, e in zip(got_plain, exact, strict=True))


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_regression_counts_an_oversampled_hot_family_at_its_own_hit_rate(policy: str) -> None:
    """Five blocks read in turn once every 200 reads of 5,000 others (so 900 blocks apart:
    they miss in a tier of fewer blocks and hit in a larger one), all five in the 10% sample:
    the sample holds ten times their share of reads. The regression takes that excess out at
    the family's own hit rate; SHARDS_adj takes it out as hits, too many where it misses."""
    limit = round(0.1 * 2**64).to_bytes(8, "big")
    family = [h for h in hashes(list(range(200)), b"hot") if h < limit][:5]
    trace = []
    for i, h in enumerate(hashes(uniform(5_000, 100_000, seed=5))):
        trace.append(h)
        if i % 200 == 0:
            trace.append(family[(i // 200) % 5])
    errors = {}
    for adjust in ("regression", "shards"):
        t = tracker(1_000, 0.1, policy, adjust=adjust)
        feed(t, trace, SIZE)
        pairs = exact_rates(policy, trace, SIZE, t.curve(), every=2)
        errors[adjust] = (mae(pairs), mae(pairs[:3]))  # all points, and 0.25x to 0.5x
    assert errors["regression"][0] <= 0.03, errors
    assert errors["shards"][1] > 2 * errors["regression"][1], errors


@pytest.mark.parametrize("policy", ["lfu", "s3fifo"])
def test_miniature_simulation_at_full_rate_is_the_exact_replay(policy: str) -> None:
    """At rate 1 each miniature cache is the real policy at full scale on the whole stream."""
    trace = hashes(zipf(3_000, 20_000))
    t = tracker(400, 1.0, policy)
    feed(t, trace, SIZE)
    curve = t.curve()
    assert curve.method == "mini" and curve.policy == policy
    for got, exact in exact_rates(policy, trace, SIZE, curve, every=2):
        assert got == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize("policy", ["lfu", "s3fifo"])
def test_miniature_simulation_sampled_is_close_to_the_exact_replay(policy: str) -> None:
    trace = hashes(zipf(60_000, 200_000, alpha=0.8))
    t = tracker(3_000, 0.1, policy)
    feed(t, trace, SIZE)
    pairs = exact_rates(policy, trace, SIZE, t.curve(), every=4)
    assert mae(pairs) <= 0.04, pairs


def test_miniature_lru_agrees_with_reuse_distances() -> None:
    trace = hashes(zipf(20_000, 60_000))
    t = tracker(1_000, 0.1, policies=("lru",))
    feed(t, trace, SIZE)
    shards, mini = t.curve(method="shards"), t.curve(method="mini")
    for a, b in zip(shards.points, mini.points, strict=True):
        assert a.hit_rate == pytest.approx(b.hit_rate, abs=0.01)


def test_a_policy_not_simulated_is_refused() -> None:
    t = tracker(100, 0.1, "s3fifo")
    with pytest.raises(ValueError, match="not simulated"):
        t.curve(policy="lfu")
    with pytest.raises(ValueError, match="LRU only"):
        t.curve(policy="s3fifo", method="shards")
    assert t.curve(policy="lru").method == "shards"  # LRU is always there
