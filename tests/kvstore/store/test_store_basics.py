"""Store behaviour over real tiers: round trips, errors, lookup, delete, stats."""

from __future__ import annotations

import dataclasses
import os

import pytest

from kvstore.errors import (
    BlockSizeError,
    InvalidHashError,
    NamespaceConflictError,
    UnknownNamespaceError,
)
from kvstore.namespace import Namespace

from .conftest import BLOCK, NS, StoreFactory, blocks


def test_round_trip_is_byte_identical(make_store: StoreFactory) -> None:
    store = make_store()
    hashes, data = blocks(5)
    assert store.put("m", hashes, data) == (5, 0, 0)
    assert store.get("m", hashes) == data
    assert store.put("m", hashes, data) == (0, 5, 0)
    store.check_integrity()


def test_bad_input_is_refused_with_a_clear_error(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(UnknownNamespaceError, match="unknown namespace 'nope'"):
        store.put("nope", [os.urandom(32)], [os.urandom(BLOCK)])
    with pytest.raises(BlockSizeError, match="4095 bytes does not match"):
        store.put("m", [os.urandom(32)], [os.urandom(BLOCK - 1)])
    with pytest.raises(InvalidHashError):
        store.put("m", [b""], [os.urandom(BLOCK)])
    with pytest.raises(InvalidHashError):
        store.get("m", ["ab" * 16])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 hashes but 1 blocks"):
        store.put("m", [os.urandom(32)] * 2, [os.urandom(BLOCK)])
    # a refused batch stores nothing, not even its valid blocks
    good, bad = os.urandom(32), os.urandom(32)
    with pytest.raises(BlockSizeError):
        store.put("m", [good, bad], [os.urandom(BLOCK), os.urandom(10)])
    assert store.get("m", [good]) == [None]
    store.check_integrity()


def test_namespace_registration_conflicts(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.register_namespace(NS) is False  # identical: accepted
    with pytest.raises(NamespaceConflictError, match="hash_seed"):
        store.register_namespace(Namespace("m", BLOCK, NS.layout, hash_seed="0"))
    with pytest.raises(NamespaceConflictError, match="block_bytes"):
        store.register_namespace(Namespace("m", BLOCK * 2, NS.layout))
    layout = dataclasses.replace(NS.layout, model_id="other", block_size=32)
    with pytest.raises(NamespaceConflictError) as err:
        store.register_namespace(Namespace("m", BLOCK, layout))
    # each field that differs, by name, and nothing of what matches
    assert str(err.value) == (
        f"namespace 'm' already exists with a different definition: layout.block_size "
        f"({NS.layout.block_size!r} registered, 32 requested), layout.model_id "
        f"({NS.layout.model_id!r} registered, 'other' requested)")
    with pytest.raises(NamespaceConflictError, match="hash_algo"):
        store.register_namespace(Namespace("m", BLOCK, NS.layout, hash_algo="sha256_cbor"))
    with pytest.raises(ValueError, match="unknown hash_algo"):
        Namespace("x", BLOCK, hash_algo="md5")


def test_lookup_returns_the_longest_prefix_without_side_effects(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(8)
    store.put("m", hashes[:3] + hashes[4:], data[:3] + data[4:])
    before = store.stats()
    result = store.lookup("m", hashes)
    assert result.prefix_blocks == 3
    assert len(result.tiers) == 3
    assert set(result.tiers) <= {"host", "disk"}
    assert store.lookup("m", hashes[4:]).prefix_blocks == 4
    assert store.lookup("m", [os.urandom(32)]).prefix_blocks == 0
    assert store.stats() == before  # no queries counted, no recency changed


def test_lookup_reports_the_top_tier(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(8)
    store.put("m", hashes, data)
    tiers = store.lookup("m", hashes).tiers
    assert tiers[:4] == ["disk"] * 4  # the oldest were demoted
    assert tiers[-1] == "host"


def test_delete_removes_from_every_tier(make_store: StoreFactory) -> None:
    store = make_store(host=2, disk=64, disk_write_through=True)
    hashes, data = blocks(4)
    store.put("m", hashes, data)
    assert store.delete("m", hashes[:2] + [os.urandom(32)]) == 2
    assert store.get("m", hashes) == [None, None, *data[2:]]
    assert not store.contains("m", hashes[0])
    store.check_integrity()


def test_stats_count_hits_and_misses_per_tier_and_namespace(make_store: StoreFactory) -> None:
    store = make_store(host=4, disk=64)
    hashes, data = blocks(8)
    store.put("m", hashes, data)
    store.get("m", hashes[-2:])  # host hits
    store.get("m", [os.urandom(32)])  # miss everywhere
    stats = store.stats()
    ns = stats.namespaces["m"]
    assert (ns.queries, ns.hits, ns.misses) == (3, 2, 1)
    assert ns.blocks == 8 and ns.bytes == 8 * BLOCK
    host, disk = stats.tiers["host"], stats.tiers["disk"]
    assert (host.queries, host.hits) == (3, 2)
    assert (disk.queries, disk.hits, disk.misses) == (1, 0, 1)
    assert host.demotions >= 4 and host.capacity_bytes == 4 * BLOCK
    assert stats.totals.hit_rate == pytest.approx(2 / 3)
    doc = stats.doc()  # the JSON /v1/stats answers with: every row has every counter
    for key in ("queries", "hits", "misses", "hit_rate", "blocks", "bytes", "capacity_bytes",
                "evictions", "promotions", "demotions", "corrupt_dropped"):
        assert key in doc["tiers"]["host"] and key in doc["namespaces"]["m"]
        assert key in doc["totals"]
    assert "backend" not in doc["tiers"]["host"]  # a tier without counters of its own


def test_health_reports_every_tier(make_store: StoreFactory) -> None:
    store = make_store(device=2)
    health = store.health()
    assert health.ok is True
    assert set(health.tiers) == {"device", "host", "disk"}
    store.close()
    assert store.health().ok is False
