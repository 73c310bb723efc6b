"""The tracker's parts: the reuse stack against a plain LRU list, the histogram, the sampler,
the simulated cache."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from kvstore.whatif import SimCache, replay
from kvstore.whatif.histogram import DistanceHistogram
from kvstore.whatif.sampler import SpatialSampler
from kvstore.whatif.stack import ReuseStack
from tests.kvstore.whatif.traces import block, hashes, zipf


def test_reuse_stack_matches_an_lru_list_through_compactions_and_removals() -> None:
    rng = random.Random(1)
    stack, order, sizes = ReuseStack(), OrderedDict[int, None](), dict[int, int]()
    for _ in range(12_000):  # several compactions at 1,024 nodes and after growth
        k = rng.randrange(2_500) if rng.random() < 0.8 else rng.randrange(50)
        size = sizes.setdefault(k, rng.randrange(1, 10))
        if rng.random() < 0.01:
            stack.remove([k])
            order.pop(k, None)
            continue
        since = stack.touch(k, size)
        if k in order:
            keys = list(order)
            assert since == sum(sizes[x] for x in keys[keys.index(k) + 1:])
            order.move_to_end(k)
        else:
            assert since is None
            order[k] = None
    assert stack.live == len(order)


def test_histogram_is_exact_for_equal_distances_and_interpolates_inside_a_bin() -> None:
    hist = DistanceHistogram(100, 1_000_000, 48)
    hist.add(5_000, 2.0, 20.0)
    assert hist.hits([4_999, 5_000, 10_000]) == ([0.0, 2.0, 2.0], [0.0, 20.0, 20.0])
    hist.add(4_960, 2.0)  # same bin (1.5% wide): a capacity between the two takes a share
    assert hist.hits([4_990])[0] == [pytest.approx(4.0 * 30 / 40)]
    hist.add(50, 1.0, 5.0)  # below the range: a hit everywhere
    hist.add(10**9, 1.0)  # above: never
    assert hist.hits([200]) == ([1.0], [5.0])
    assert hist.total() == 6.0


def test_sampler_compares_the_hash_prefix_and_samples_about_its_rate() -> None:
    sampler = SpatialSampler(0.05)
    keys = [block(i) for i in range(40_000)]
    picked = set(sampler.picks(keys))
    assert 0.045 < len(picked) / len(keys) < 0.055
    assert all((sampler.value(keys[i]) < sampler.limit) == (i in picked) for i in range(2_000))
    before = picked
    sampler.set_limit(sampler.limit // 2)  # lowering only drops keys
    assert set(sampler.picks(keys)) <= before
    assert abs(sampler.rate - 0.025) < 1e-12


def test_sampler_long_runs_pick_as_one_by_one() -> None:
    """A run of 256 or more 32-byte hashes is tested as one array; a run with other lengths
    (or a short one) one by one: the same picks, a hash at the threshold itself included."""
    sampler = SpatialSampler(0.3)
    at, below = (sampler.limit - d for d in (0, 1))
    keys = [block(i) for i in range(600)] + [n.to_bytes(8, "big") + bytes(24) for n in (at, below)]
    alone = [i for i, k in enumerate(keys) if sampler.picks([k])]
    assert sampler.picks(keys) == alone and len(alone) > 100
    assert 600 not in alone and 601 in alone  # at the threshold: out; just below it: in
    mixed = [*keys, b"\x00" * 8]  # not all 32 bytes: compared one by one
    assert sampler.picks(mixed) == [*alone, 602]


def test_sampler_hashes_keys_that_are_not_hash_outputs() -> None:
    counting = [i.to_bytes(8, "big") for i in range(20_000)]  # all "below" any threshold
    assert len(SpatialSampler(0.1).picks(counting)) == len(counting)
    mixed = SpatialSampler(0.1, uniform=False).picks(counting)
    assert 0.08 < len(mixed) / len(counting) < 0.12


def test_sampler_rate_one_samples_everything() -> None:
    assert SpatialSampler(1.0).picks([b"\xff" * 32, b"\x00"]) == [0, 1]
    with pytest.raises(ValueError):
        SpatialSampler(0.0)


def test_sim_cache_holds_at_most_its_bytes_and_evicts_by_its_policy() -> None:
    cache = SimCache("lru", 10)
    for k in range(4):
        assert not cache.read(k, 3)
    assert cache.used == 9 and 0 not in cache  # 4 x 3 bytes > 10: the oldest left
    assert cache.read(1, 3)
    cache.insert(9, 3)  # a demotion: in, without counting as a request
    assert 2 not in cache and 1 in cache and cache.used == 9
    assert not cache.read(7, 11)  # larger than the whole cache: not stored
    assert 7 not in cache
    cache.resize(4)
    assert cache.used <= 4 and len(cache) == 1


@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo", "sampled_lfu"])
def test_replay_is_the_eviction_bench_simulation_for_equal_sizes(policy: str) -> None:
    """One block per unit of capacity: the replay is the eviction bench's ``simulate``."""
    from kvstore.policy import make_policy

    keys = [("ns", h) for h in hashes(zipf(400, 4_000))]
    hits = replay(policy, keys, [1] * len(keys), 50)
    p = make_policy(policy)
    expected = 0
    for key in keys:
        if key in p:
            expected += 1
            p.on_hit(key)
            continue
        if len(p) >= 50:
            p.on_remove(p.victims(1, lambda _: True)[0])
        p.on_put(key, 1)
    if policy.startswith("sampled"):  # random victims: close, not equal
        assert abs(sum(hits) - expected) < 0.05 * len(keys)
    else:
        assert sum(hits) == expected
