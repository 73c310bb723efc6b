"""Two nodes on one bucket: what one writes, the other discovers and reads byte-identical;
a miss storm is absorbed by the negative cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvstore.tiers.s3 import S3Tier
from tests.kvstore.tiers.contract import KiB, block, item, key

MakeTier = Callable[..., S3Tier]


def count_requests(tier: S3Tier, op: str) -> list[int]:
    """A one-element counter of ``op`` requests that ``tier`` sends."""
    counter = [0]

    def hook(**_: Any) -> None:
        counter[0] += 1

    tier.client.meta.events.register(f"before-send.s3.{op}", hook)
    return counter


def test_block_written_by_one_node_is_discovered_and_read_by_another(make_tier: MakeTier) -> None:
    node_a, node_b = make_tier(), make_tier()
    blocks = {key(i): block(256 * KiB) for i in range(8)}
    node_a.put_many([item(k, v, layout_id=3) for k, v in blocks.items()])
    node_a.flush()
    assert not node_b.contains(key(0))
    assert node_b.get_many([key(0)]) == [None]  # not known yet: no blind GETs
    metas = node_b.discover([*blocks, key(99)])
    assert metas[:-1] == [item(k, v, layout_id=3)[2] for k, v in blocks.items()]
    assert metas[-1] is None
    assert all(node_b.contains(k) for k in blocks)
    assert node_b.used_bytes() == 8 * 256 * KiB
    assert node_b.stats()["discovered"] == 8
    assert node_b.get_many(list(blocks)) == list(blocks.values())


def test_discover_answers_known_blocks_without_asking_s3(make_tier: MakeTier) -> None:
    tier = make_tier()
    data = block(100)
    tier.put_many([item(key(1), data)])
    heads = count_requests(tier, "HeadObject")
    assert tier.discover([key(1)]) == [item(key(1), data)[2]]  # still queued or uploaded
    tier.flush()
    assert tier.discover([key(1)]) == [item(key(1), data)[2]]
    assert heads[0] == 0


def test_negative_cache_absorbs_a_miss_storm_then_expires(make_tier: MakeTier) -> None:
    writer = make_tier()
    reader = make_tier(negative_ttl_s=0.5)
    heads = count_requests(reader, "HeadObject")
    missing = [key(i) for i in range(10)]
    assert reader.discover(missing) == [None] * 10
    assert heads[0] == 10
    for _ in range(20):  # the storm: every lookup asks again
        assert reader.discover(missing) == [None] * 10
    assert heads[0] == 10
    assert reader.stats()["negative_hits"] == 200
    # Another node writes one of them: visible once the negative entry expires.
    data = block(1000)
    writer.put_many([item(key(3), data)])
    writer.flush()
    assert reader.discover([key(3)]) == [None]
    time.sleep(0.6)
    assert reader.discover([key(3)]) == [item(key(3), data)[2]]
    assert heads[0] == 11
    assert reader.get_many([key(3)]) == [data]


def test_own_put_clears_the_negative_entry(make_tier: MakeTier) -> None:
    tier = make_tier(negative_ttl_s=60)
    assert tier.discover([key(1)]) == [None]
    data = block(10)
    tier.put_many([item(key(1), data)])
    assert tier.discover([key(1)]) == [item(key(1), data)[2]]


def test_block_another_node_evicted_becomes_a_miss(make_tier: MakeTier) -> None:
    node_a, node_b = make_tier(), make_tier()
    data = block(2000)
    node_a.put_many([item(key(1), data)])
    node_a.flush()
    node_b.discover([key(1)])
    node_a.delete([key(1)])
    node_a.flush()  # waits for the background delete too
    assert node_b.get_many([key(1)]) == [None]
    assert not node_b.contains(key(1))
    assert node_b.used_bytes() == 0


def test_prefix_discovery_stops_after_the_first_window_with_a_miss(make_tier: MakeTier) -> None:
    writer = make_tier()
    reader = make_tier(max_workers=2)  # windows of 4 keys
    chain = [key(i) for i in range(40)]
    writer.put_many([item(k, block(100)) for k in chain[:6]])  # S3 holds the first 6
    writer.flush()
    heads = count_requests(reader, "HeadObject")
    metas = reader.discover(chain, prefix=True)
    assert [m is not None for m in metas] == [True] * 6 + [False] * 34
    # Window 1: the HEADs of its first and last key (block 0's group object lists blocks 0-5);
    # window 2: blocks 6 and 7 are not there, the prefix ends. One object per block: 8 HEADs.
    assert heads[0] == 4
    assert reader.discover(chain, prefix=True)[:6] == metas[:6]
    assert heads[0] == 4  # known blocks and the negative entries answer the second time
    single = make_tier(max_workers=2, group_blocks=1)
    heads = count_requests(single, "HeadObject")
    assert single.discover(chain, prefix=True) == metas
    assert heads[0] == 8  # two windows of 4, not 40 requests


def test_discovery_does_not_adopt_past_capacity(make_tier: MakeTier) -> None:
    writer = make_tier()
    writer.put_many([item(key(i), block(1000)) for i in range(3)])
    writer.flush()
    small = make_tier(capacity=2500)
    metas = small.discover([key(0), key(1), key(2)])
    assert [m is not None for m in metas] == [True, True, False]
    assert small.used_bytes() == 2000 <= small.capacity_bytes
    assert small.stats()["over_capacity"] == 1
    assert not small.contains(key(2))
