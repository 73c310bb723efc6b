"""Two stores (two nodes) on one bucket, through the store API: what A demotes to S3, B's
lookup finds and B's get reads byte-identical; prefetch pulls it into B's host tier; a store
whose S3 is down keeps serving from its upper tiers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Layout, Namespace
from kvstore.store import Store
from kvstore.testing.seaweed import SeaweedServer
from tests.kvstore.s3.conftest import FAST
from tests.kvstore.s3.faults import wait_for

BLOCK = 64 << 10
NS = Namespace("m", BLOCK, Layout(model_id="tiny", num_layers=2, block_size=16, dtype="f32"))


@pytest.fixture
def make_store(seaweed: SeaweedServer, prefix: str) -> Iterator[Callable[..., Store]]:
    made: list[Store] = []

    def make(host_blocks: int = 4, **s3: Any) -> Store:
        options = seaweed.options(**{"prefix": prefix, **FAST, **s3})
        config = StoreConfig(
            (
                TierConfig("host", host_blocks * BLOCK, options={"slot_bytes": BLOCK}),
                TierConfig("s3", 1 << 30, options=options),
            )
        )
        store = Store(config)
        store.register_namespace(NS)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def test_block_demoted_by_one_node_is_found_and_read_by_another(
    make_store: Callable[..., Store],
) -> None:
    node_a, node_b = make_store(), make_store()
    hashes = [os.urandom(32) for _ in range(12)]
    data = [os.urandom(BLOCK) for _ in range(12)]
    node_a.put("m", hashes, data)
    a_tiers = node_a.lookup("m", hashes).tiers
    assert "s3" in a_tiers and "host" in a_tiers  # the host tier overflowed into S3
    node_a.flush()
    in_s3 = a_tiers.index("host")  # the oldest blocks were demoted first
    assert node_b.lookup("m", hashes[:in_s3]) == (in_s3, ["s3"] * in_s3)
    assert node_b.get("m", hashes[:in_s3]) == data[:in_s3]
    node_b.check_integrity()
    node_a.check_integrity()


def test_prefetch_pulls_shared_blocks_into_the_host_tier(make_store: Callable[..., Store]) -> None:
    node_a, node_b = make_store(host_blocks=2), make_store(host_blocks=8)
    hashes = [os.urandom(32) for _ in range(6)]
    data = [os.urandom(BLOCK) for _ in range(6)]
    node_a.put("m", hashes, data)
    node_a.flush()
    shared = hashes[:4]
    assert node_b.lookup("m", shared).tiers == ["s3"] * 4
    assert node_b.prefetch("m", shared).result(timeout=30) == 4
    assert node_b.lookup("m", shared).tiers == ["host"] * 4
    assert node_b.get("m", shared) == data[:4]


def test_store_keeps_serving_when_s3_is_unreachable(make_store: Callable[..., Store]) -> None:
    store = make_store(endpoint_url="http://127.0.0.1:9")  # nothing listens
    health = store.health()
    assert health.ok is True and health.tiers["s3"].ok is False
    assert health.doc()["tiers"]["s3"]["reason"] == "unavailable"
    hashes = [os.urandom(32) for _ in range(10)]
    data = [os.urandom(BLOCK) for _ in range(10)]
    store.put("m", hashes, data)  # overflows into the write-back queue, never blocks
    assert store.get("m", hashes[-4:]) == data[-4:]  # still in host
    wait_for(lambda: store.health().doc()["tiers"]["s3"]["pending"] == 0, what="queue drained")
    assert store.health().doc()["tiers"]["s3"]["dropped"] >= 1
    assert store.get("m", hashes[:1]) == [None]  # demoted and dropped: a miss, not an error


def test_demoted_chains_land_grouped_and_another_node_reads_them_by_group(
    make_store: Callable[..., Store],
) -> None:
    node_a, node_b = make_store(host_blocks=16), make_store(host_blocks=64)
    chains = [[os.urandom(32) for _ in range(8)] for _ in range(6)]
    data = {h: os.urandom(BLOCK) for chain in chains for h in chain}
    for chain in chains:  # the host tier overflows: demotions go down in batches
        node_a.put("m", chain, [data[h] for h in chain])
    node_a.flush()
    s3 = node_a.tier("s3").stats()
    assert s3["blocks"] >= 16 and s3["objects"] * 2 <= s3["blocks"]  # grouped, not 1:1
    first = chains[0]
    assert node_b.lookup("m", first) == (8, ["s3"] * 8)
    tier = node_b.tier("s3")
    gets = [0]
    tier.client.meta.events.register(  # type: ignore[attr-defined]
        "before-send.s3.GetObject", lambda **_: gets.__setitem__(0, gets[0] + 1)
    )
    assert node_b.get("m", first) == [data[h] for h in first]
    assert gets[0] < 8
    node_a.check_integrity()
    node_b.check_integrity()


def test_evictions_from_a_full_s3_tier_keep_accounting_and_the_bucket_in_step(
    seaweed: SeaweedServer, prefix: str
) -> None:
    options = seaweed.options(prefix=prefix, **FAST)
    config = StoreConfig(
        (
            TierConfig("host", 8 * BLOCK, options={"slot_bytes": BLOCK}),
            TierConfig("s3", 24 * BLOCK, options=options),
        )
    )
    store = Store(config)
    store.register_namespace(NS)
    try:
        chains = [[os.urandom(32) for _ in range(8)] for _ in range(10)]
        data = {h: os.urandom(BLOCK) for chain in chains for h in chain}
        for chain in chains:  # 80 blocks through 8 host slots into 24 S3 blocks' room
            store.put("m", chain, [data[h] for h in chain])
            store.flush()
            store.check_integrity()
        tier = store.tier("s3")
        stats = tier.stats()  # type: ignore[attr-defined]
        assert 0 < stats["used_bytes"] <= tier.capacity_bytes
        resp = seaweed.client().list_objects_v2(Bucket=seaweed.bucket, Prefix=f"{prefix}/")
        stored = sum(o["Size"] for o in resp.get("Contents", []))
        assert stored == stats["used_bytes"] + stats["dead_bytes"]  # nothing leaked
        last = chains[-1]
        assert store.get("m", last) == [data[h] for h in last]
    finally:
        store.close()
