"""The store's what-if curves, fed by real traffic: an engine's lookup, get of the hit and put
of the rest. The curve at today's capacity is the hit rate the tier has; at twice the capacity
it is the hit rate a store twice as large has on the same traffic; promotions, lookups' misses,
deleted namespaces and the advisor's prices are counted as the stats count them."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvstore.namespace import Layout, Namespace
from kvstore.store import Store
from kvstore.whatif import WhatIfConfig

from .conftest import BLOCK, NS, StoreFactory

EXACT = WhatIfConfig(sample_rate=1.0)  # every block tracked: the curve is exact LRU
PAYLOAD = bytes(range(256)) * (BLOCK // 256)


def _chain(doc: int, length: int) -> list[bytes]:
    return [hashlib.sha256(f"{doc}/{j}".encode()).digest() for j in range(length)]


def _serve(store: Store, chains: list[list[bytes]], ns: str = "m") -> None:
    """What an engine does for each prompt: look the chain up, read the hit, put the rest."""
    for chain in chains:
        n = store.lookup(ns, chain).prefix_blocks
        if n:
            assert all(b is not None for b in store.get(ns, chain[:n]))
        if n < len(chain):
            store.put(ns, chain[n:], [PAYLOAD] * (len(chain) - n))


def _traffic(requests: int, docs: int = 48, length: int = 4, seed: int = 7) -> list[list[bytes]]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, docs + 1) ** 0.8
    picks = rng.choice(docs, size=requests, p=weights / weights.sum())
    return [_chain(int(d), length) for d in picks]


def test_the_curve_at_today_and_at_twice_the_capacity_match_real_stores(
    make_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    traffic = _traffic(1500)
    small = make_store(host=48, disk=512, whatif=EXACT)
    _serve(small, traffic)
    curve = small.whatif("host")
    assert curve.policy == "lru" and curve.method == "shards" and curve.sample_rate == 1.0
    assert len(curve.points) == 17
    assert curve.points[0].capacity_bytes == 12 * BLOCK
    assert curve.points[-1].capacity_bytes == 192 * BLOCK
    assert curve.current.capacity_bytes == 48 * BLOCK
    host = small.stats().tiers["host"]
    real = host.hits / host.queries
    # the lookups' misses are requests the stats do not count as gets: compare with the
    # tracker's own count of the tier's answers, and the gets' share with the stats
    assert curve.observed_hit_rate is not None
    assert curve.current.hit_rate == pytest.approx(curve.observed_hit_rate, abs=0.03)
    assert 0.2 < curve.observed_hit_rate < real  # gets alone hit more often
    big = make_store(host=96, disk=512, whatif=EXACT, path=tmp_path_factory.mktemp("big"))
    _serve(big, traffic)
    bigger = big.whatif("host")
    assert bigger.observed_hit_rate is not None
    assert curve.at(96 * BLOCK) == pytest.approx(bigger.observed_hit_rate, abs=0.05)
    assert bigger.observed_hit_rate > curve.observed_hit_rate + 0.05  # a real difference
    # the disk tier runs sampled LRU: its curve is LRU's; the blocks the host tier served
    # are not its requests
    disk = small.whatif("disk")
    assert disk.policy == "lru" and disk.method == "shards"
    assert disk.accesses < curve.accesses


def test_a_policy_other_than_lru_is_simulated(make_store: StoreFactory) -> None:
    """An LFU host tier's curve comes from miniature LFU caches; asked for what the tier
    would do under S3-FIFO, the simulation configured for it answers."""
    traffic = _traffic(1500)
    store = make_store(host=48, disk=512, host_policy="lfu",
                       whatif=WhatIfConfig(sample_rate=1.0, policies=("lfu", "s3fifo")))
    _serve(store, traffic)
    lfu = store.whatif("host")
    assert lfu.policy == "lfu" and lfu.method == "mini"
    assert lfu.observed_hit_rate is not None
    assert lfu.current.hit_rate == pytest.approx(lfu.observed_hit_rate, abs=0.05)
    assert store.whatif("host", policy="s3fifo").method == "mini"
    rates = [p.hit_rate for p in lfu.points]
    assert rates[-1] > rates[0] + 0.2  # more room, more hits


def test_a_promotion_is_a_miss_of_the_upper_tier_not_a_second_request(
    make_store: StoreFactory
) -> None:
    store = make_store(host=8, disk=64, whatif=EXACT)
    chain = _chain(1, 4)
    store.put("m", chain, [PAYLOAD] * 4)
    store.put("m", _chain(2, 8), [PAYLOAD] * 8)  # pushes the first chain down to disk
    assert set(store.lookup("m", chain).tiers) == {"disk"}
    store.get("m", chain)  # served by disk, promoted to host
    store.get("m", chain)  # served by host
    host = store.whatif("host")
    assert host.accesses == 8 and host.observed_hit_rate == 0.5
    assert host.current.hit_rate == 0.5
    # the first get's blocks were 12 blocks deep (the rest of their chain, the other chain
    # and themselves): twice the host tier (16 blocks, 14.4 held) would have served them
    assert host.at(16 * BLOCK) == 1.0
    assert store.whatif("disk").accesses == 4  # the second get never reached the disk


def test_a_lookups_misses_count_for_every_tier(make_store: StoreFactory) -> None:
    store = make_store(host=8, disk=64, whatif=EXACT)
    assert store.lookup("m", _chain(3, 5)).prefix_blocks == 0
    for tier in ("host", "disk"):
        curve = store.whatif(tier)
        assert curve.accesses == 5 and curve.observed_hit_rate == 0.0


def test_namespaces_a_deleted_one_reset_and_off(
    make_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    store = make_store(host=16, disk=64, whatif=EXACT)
    store.register_namespace(Namespace("n", BLOCK, Layout(model_id="other")))
    _serve(store, _traffic(60, docs=6))
    _serve(store, _traffic(30, docs=3, seed=2), ns="n")
    assert store.whatif("host", ["n"]).accesses == 30 * 4
    assert store.whatif("host").accesses == 90 * 4
    assert store.advise("host").unpriced == ("n",)  # its layout names no block_size
    store.delete_namespace("n")
    assert store.whatif("host").accesses == 60 * 4
    assert store.whatif("host", ["n"]).accesses == 0
    with pytest.raises(LookupError, match="no tier 'ssd'"):
        store.whatif("ssd")
    with pytest.raises(ValueError, match="not simulated"):
        store.whatif("host", policy="lfu")
    store.reset_whatif()
    assert store.whatif("host").accesses == 0
    off = make_store(host=16, disk=0, whatif=None, path=tmp_path_factory.mktemp("off"))
    with pytest.raises(LookupError, match="off"):
        off.whatif("host")


def test_the_advisor_prices_the_next_step_in_prefill(make_store: StoreFactory) -> None:
    store = make_store(host=48, disk=512, whatif=EXACT)
    _serve(store, _traffic(1500))
    curve = store.whatif("host")
    advice = store.advise("host", prefill_tokens_per_s=1000.0)
    assert advice.current == curve.current
    assert advice.next_step.capacity_bytes == 96 * BLOCK
    per_hour = curve.accesses * 3600 / advice.window_s
    assert advice.requests_per_hour == pytest.approx(per_hour, rel=0.01)
    more = (curve.at(96 * BLOCK) - curve.current.hit_rate) * per_hour
    assert advice.next_step.hits_per_hour == pytest.approx(more, rel=0.05)
    assert advice.next_step.tokens_per_hour == pytest.approx(16 * more, rel=0.05)  # NS: 16
    assert advice.next_step.prefill_s_per_hour == pytest.approx(16 * more / 1000, rel=0.05)
    assert [s.capacity_bytes for s in advice.steps] == [
        p.capacity_bytes for p in curve.points if p.capacity_bytes > 48 * BLOCK]
    assert advice.unpriced == ()
    assert store.advise("host").next_step.prefill_s_per_hour is None
    with pytest.raises(ValueError, match="positive"):
        store.advise("host", prefill_tokens_per_s=0)
    assert NS.layout.block_size == 16
