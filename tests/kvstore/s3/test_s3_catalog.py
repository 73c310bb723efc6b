"""The S3 tier's catalog (a local LMDB file) and the store's cold index over it: an S3-only
block costs no entry in the store's RAM index and no exact-policy entry, a restart with a
catalog path keeps what the node held without asking S3, capacity holds under the sampled
policy, and discovery adopts another node's blocks into the catalog."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Layout, Namespace
from kvstore.policy.base import Policy
from kvstore.store import Store
from kvstore.testing.seaweed import SeaweedServer
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3.holdings import Holdings
from kvstore.tiers.s3.layout import Where
from tests.kvstore.s3.conftest import FAST

BLOCK = 16 << 10
NS = Namespace("m", BLOCK, Layout(model_id="tiny", num_layers=2, block_size=16, dtype="f32"))


@pytest.fixture
def make_store(seaweed: SeaweedServer, prefix: str) -> Iterator[Callable[..., Store]]:
    made: list[Store] = []

    def make(host_blocks: int = 4, s3_blocks: int = 1 << 14, disk: str | None = None,
             disk_blocks: int = 8, **s3: Any) -> Store:
        options = seaweed.options(**{"prefix": prefix, **FAST, **s3})
        tiers = [TierConfig("host", host_blocks * BLOCK, options={"slot_bytes": BLOCK})]
        if disk is not None:
            tiers.append(TierConfig("disk", disk_blocks * BLOCK, options={"path": disk}))
        tiers.append(TierConfig("s3", s3_blocks * BLOCK, options=options))
        config = StoreConfig(tuple(tiers))
        store = Store(config)
        store.register_namespace(NS)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def _blocks(n: int) -> tuple[list[bytes], list[bytes]]:
    return [os.urandom(32) for _ in range(n)], [os.urandom(BLOCK) for _ in range(n)]


def _in_ram(store: Store) -> set[bytes]:
    return {key[1] for key, _ in store._ledger.memory_items()}


def _s3_policy(store: Store) -> Policy:
    return store._ledger.policies[store.tier_names().index("s3")]


def _requests(store: Store, *ops: str) -> list[str]:
    """A list that each S3 request of ``ops`` the store's S3 tier sends appends its name to."""
    sent: list[str] = []
    for op in ops:
        store.tier("s3").client.meta.events.register(  # type: ignore[attr-defined]
            f"before-send.s3.{op}", lambda op=op, **_: sent.append(op))
    return sent


def test_s3_only_blocks_have_no_index_entry_and_no_exact_policy_entry(
    make_store: Callable[..., Store],
) -> None:
    store = make_store(host_blocks=4)
    hashes, data = _blocks(12)
    store.put("m", hashes, data)
    tiers = store.lookup("m", hashes).tiers
    s3_only = [h for h, t in zip(hashes, tiers, strict=True) if t == "s3"]
    n = len(s3_only)
    assert n >= 8 and s3_only == hashes[:n]  # the oldest went down
    assert not _in_ram(store) & set(s3_only)  # nothing in RAM per S3-only block
    policy = _s3_policy(store)
    assert policy.name.startswith("sampled")  # scores only: no OrderedDict node per block
    assert len(policy) == n and all(("m", h) in policy for h in s3_only)
    store.flush()
    assert store.get("m", s3_only) == data[:n]
    assert store.stats().namespaces["m"].blocks == 12
    store.check_integrity()


def test_restart_with_a_catalog_keeps_blocks_findable_without_asking_s3(
    make_store: Callable[..., Store], tmp_path: Path,
) -> None:
    catalog = str(tmp_path / "catalog")
    first = make_store(host_blocks=2, catalog_path=catalog, scan_on_start=False)
    hashes, data = _blocks(10)
    first.put("m", hashes, data)
    first.close()  # spills nothing below S3: the host's blocks are lost, S3's stay
    again = make_store(host_blocks=2, catalog_path=catalog, scan_on_start=False)
    sent = _requests(again, "HeadObject", "ListObjects", "ListObjectsV2")
    n = len(again.tier("s3"))
    assert n >= 8
    assert again.lookup("m", hashes[:n]).tiers == ["s3"] * n  # from the catalog
    assert not _in_ram(again)
    assert again.get("m", hashes[:n]) == data[:n]  # byte-identical, read from S3
    assert sent == []  # no scan, no discovery: the catalog answered
    stats = again.stats()
    assert stats.namespaces["m"].blocks == n
    assert stats.tiers["s3"].backend["discovered"] == 0
    again.check_integrity()


def test_capacity_holds_and_s3_evicts_with_the_sampled_policy(
    make_store: Callable[..., Store],
) -> None:
    store = make_store(host_blocks=2, s3_blocks=6, group_blocks=1)
    s3 = store.tier("s3")
    written: list[tuple[bytes, bytes]] = []
    for _ in range(6):
        hashes, data = _blocks(4)
        store.put("m", hashes, data)
        written += zip(hashes, data, strict=True)
        assert s3.used_bytes() <= s3.capacity_bytes
        store.check_integrity()
    store.flush()
    assert len(s3) <= 6 and store.stats().tiers["s3"].evictions > 0
    found = store.lookup("m", [h for h, _ in written[-6:]])
    assert found.tiers  # the newest blocks are still there
    assert store.get("m", [h for h, _ in written[-2:]]) == [d for _, d in written[-2:]]
    store.check_integrity()


def test_discovery_adopts_another_node_s_blocks_into_the_catalog(
    make_store: Callable[..., Store],
) -> None:
    node_a, node_b = make_store(host_blocks=2), make_store(host_blocks=2)
    hashes, data = _blocks(8)
    node_a.put("m", hashes, data)
    node_a.flush()
    assert node_b.lookup("m", hashes[:6]).tiers == ["s3"] * 6
    assert len(node_b.tier("s3")) == 6  # adopted into B's catalog
    assert not _in_ram(node_b) & set(hashes[:6])
    assert node_b.get("m", hashes[:6]) == data[:6]
    assert node_b.stats().namespaces["m"].blocks == 6
    node_b.check_integrity()
    tiers = node_b.lookup("m", hashes[:6]).tiers  # the get promoted some into B's host
    on_host = {h for h, t in zip(hashes, tiers, strict=False) if t == "host"}
    node_a.delete("m", hashes[:6])  # A's deletes remove the objects B adopted
    node_a.flush()
    got = node_b.get("m", hashes[:6])  # what B reads from S3 is a miss, and forgotten
    assert got == [d if h in on_host else None for h, d in zip(hashes, data[:6], strict=False)]
    assert node_b.stats().namespaces["m"].blocks == len(on_host)
    assert len(node_b.tier("s3")) == len(on_host)  # read from host: S3 not asked
    node_b.check_integrity()


def test_namespace_delete_removes_s3_only_blocks(make_store: Callable[..., Store]) -> None:
    store = make_store(host_blocks=2)
    hashes, data = _blocks(10)
    store.put("m", hashes, data)
    store.flush()
    s3 = store.tier("s3")
    assert len(s3) >= 8
    assert store.delete_namespace("m") == 10
    store.flush()
    assert len(s3) == 0 and s3.used_bytes() == 0 and s3.keys_of("m") == []
    assert "m" not in store.stats().namespaces
    listed = s3.client.list_objects_v2(Bucket=s3.settings.bucket,  # type: ignore[attr-defined]
                                       Prefix=s3.settings.key_prefix)
    assert listed.get("KeyCount", 0) == 0  # the objects are gone from the bucket too
    store.check_integrity()


def test_a_chain_across_disk_and_s3_is_found_whole(
    make_store: Callable[..., Store], tmp_path: Path,
) -> None:
    store = make_store(host_blocks=2, disk=str(tmp_path / "disk"), disk_blocks=6)
    hashes, data = _blocks(16)
    store.put("m", hashes, data)
    store.flush()
    tiers = store.lookup("m", hashes).tiers
    assert len(tiers) == 16 and {"host", "disk", "s3"} <= set(tiers)
    assert not _in_ram(store) & {h for h, t in zip(hashes, tiers, strict=True) if t != "host"}
    assert store.get("m", hashes) == data
    store.check_integrity()
    assert store.stats().namespaces["m"].blocks == 16


def test_blocks_queued_for_upload_are_found_and_read(make_store: Callable[..., Store]) -> None:
    store = make_store(host_blocks=2, endpoint_url="http://127.0.0.1:9", demote_retries=1000,
                       retry_backoff_s=1.0, flush_timeout_s=0.5)  # uploads keep retrying
    hashes, data = _blocks(8)
    store.put("m", hashes, data)
    assert store.tier("s3").health()["pending"] >= 1
    tiers = store.lookup("m", hashes).tiers
    assert tiers.count("s3") >= 6
    assert store.get("m", hashes) == data  # the queued ones from the write-back queue
    store.check_integrity()


def _k(i: int) -> tuple[str, bytes]:
    return "ns", bytes([i]) * 8


def test_holdings_in_a_catalog_path_survive_a_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "cat")
    meta = BlockMeta(1, 2, 10)
    held = Holdings(path, identity="a")
    with held.lock:  # one batch, committed on release
        for i in range(3):
            held.hold(_k(i), meta, Where(_k(0), i))
        held.forget(_k(1))
    held.close()
    again = Holdings(path, identity="a")
    assert again.used == 20 and again.dead_bytes == 10 and again.objects == 1
    assert len(again) == 2 and again.namespace_usage() == {"ns": (2, 20)}
    assert again.where(_k(2)) == Where(_k(0), 2) and again.revivable(_k(1), meta)
    assert sorted(again.keys_of("ns")) == [_k(0), _k(2)]
    assert again.leading("ns", [_k(0)[1], _k(2)[1], _k(1)[1]]) == 2
    again.close()
    other = Holdings(path, identity="b")  # another bucket or prefix: started afresh
    assert len(other) == 0 and other.used == 0 and other.keys_of("ns") == []
    other.close()
