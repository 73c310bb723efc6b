"""Namespaces as a trust boundary: one validation, bounded metadata,
caps on their number, deletion from every tier, a private file that a bad entry cannot break,
and registrations that never hold the store's lock while the file is written."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import NamespaceLimitError, UnknownNamespaceError
from kvstore.namespace import Layout, Namespace
from kvstore.store import Store

from .conftest import BLOCK, NS, StoreFactory, blocks


def nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(depth - 1):
        doc = {"a": doc}
    return doc


# -- one validation, bounded fields (item 6) --------------------------------------------------
@pytest.mark.parametrize("bad", [
    {"block_bytes": 1 << 62},
    {"hash_seed": "s" * 100_000},
    {"tenant": 7},
    {"tenant": ""},
    {"hash_algo": ["sha256"]},
    {"name": "x" * 200},
    {"layout": {"extra": nested(300)}},
    {"layout": {"extra": {"big": "x" * 5000}}},
    {"layout": {"extra": {"k": list(range(5000))}}},
    {"layout": {"extra": {"b": b"bytes"}}},
    {"layout": {"extra": {"n": float("nan")}}},
    {"layout": {"extra": {1: "int key"}}},
    {"layout": {"extra": "not a map"}},
    {"layout": {"model_id": "m" * 1000}},
    {"layout": {"num_layers": 1 << 40}},
    {"layout": {"nope": 1}},
])
def test_namespace_fields_are_bounded(bad: dict[str, Any]) -> None:
    """What REST and the data plane both build a namespace through."""
    with pytest.raises(ValueError):
        Namespace.from_dict({"name": "n", "block_bytes": BLOCK, **bad})


def test_layout_extra_within_bounds_is_accepted() -> None:
    ns = Namespace("n", BLOCK, Layout(extra={"lora": nested(7), "s": "x" * 1000}))
    assert Namespace.from_dict(json.loads(json.dumps(ns.to_dict()))) == ns


# -- caps on the number of namespaces (item 6) ------------------------------------------------
def test_namespace_caps_total_and_per_tenant(make_store: StoreFactory) -> None:
    store = make_store(register=False, max_namespaces=4, max_namespaces_per_tenant=2)
    store.register_namespace(Namespace("a1", BLOCK, tenant="a"))
    store.register_namespace(Namespace("a2", BLOCK, tenant="a"))
    with pytest.raises(NamespaceLimitError, match="tenant 'a'"):
        store.register_namespace(Namespace("a3", BLOCK, tenant="a"))
    assert store.register_namespace(Namespace("a1", BLOCK, tenant="a")) is False  # same: ok
    store.register_namespace(Namespace("b1", BLOCK, tenant="b"))
    store.register_namespace(Namespace("admin1", BLOCK))
    with pytest.raises(NamespaceLimitError, match="max_namespaces"):
        store.register_namespace(Namespace("b2", BLOCK, tenant="b"))
    store.delete_namespace("a1")
    store.register_namespace(Namespace("a3", BLOCK, tenant="a"))  # room again


# -- deletion from every tier (item 6) --------------------------------------------------------
def test_delete_namespace_removes_its_blocks_from_every_tier(
        make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(host=8, disk=64)
    other = Namespace("other", BLOCK)
    store.register_namespace(other)
    hashes, datas = blocks(20)  # 8 fit in host: the rest are demoted to disk
    store.put(NS.name, hashes, datas)
    store.put(NS.name, hashes[:3], datas[:3], tier="disk")  # copies in both tiers
    store.pin(NS.name, hashes[-2:], lease_s=60)
    keep_h, keep_d = blocks(3)
    store.put(other.name, keep_h, keep_d)
    assert store.delete_namespace(NS.name) == 20
    store.check_integrity()
    assert NS.name not in {ns.name for ns in store.namespaces()}
    assert NS.name not in store.stats().namespaces
    for tier in ("host", "disk"):
        assert not any(store.tier(tier).contains((NS.name, h)) for h in hashes)
    with pytest.raises(UnknownNamespaceError):
        store.get(NS.name, hashes[:1])
    assert store.get(other.name, keep_h) == keep_d
    with pytest.raises(UnknownNamespaceError):
        store.delete_namespace(NS.name)
    store.close()
    # gone across a restart too: neither the definition nor its blocks come back
    again = make_store(register=False)
    assert [ns.name for ns in again.namespaces()] == ["other"]
    assert again.stats().totals.blocks == 3
    again.register_namespace(NS)
    assert again.get(NS.name, hashes) == [None] * 20


# -- the file: private, and a bad entry breaks nothing (items 5, 6) ---------------------------
def test_store_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    folder = tmp_path / "fresh" / "store"
    old = os.umask(0)
    try:
        store = Store(StoreConfig((TierConfig("disk", 64 * BLOCK,
                                              options={"path": str(folder / "lmdb")}),),
                                  namespaces_path=str(folder / "ns.json")))
        store.register_namespace(NS)
        store.put(NS.name, *blocks(2))
        store.close()
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*")}
    assert modes["lmdb"] == 0o700, modes
    for name in ("data.mdb", "lock.mdb", "ns.json"):
        assert modes[name] == 0o600, modes


def test_invalid_file_entry_is_skipped_not_fatal(make_store: StoreFactory,
                                                 tmp_path: Path) -> None:
    good = NS.to_dict()
    deep = {**good, "name": "deep", "layout": {"extra": nested(300)}}
    junk = {"name": 7}
    (tmp_path / "ns.json").write_text(json.dumps([deep, good, junk, "x"]))
    store = make_store(register=False)
    assert [ns.name for ns in store.namespaces()] == [NS.name]
    kept = json.loads((tmp_path / "ns.json.invalid").read_text())
    assert kept[0]["name"] == "deep"  # what was skipped is kept for the operator


def test_unreadable_file_does_not_stop_the_store(make_store: StoreFactory,
                                                 tmp_path: Path) -> None:
    (tmp_path / "ns.json").write_text("[" * 100_000)
    store = make_store()
    assert [ns.name for ns in store.namespaces()] == [NS.name]


# -- registration off the store lock (item 9) -------------------------------------------------
def test_registration_does_not_hold_the_store_lock_while_writing_its_file(
        make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store()
    hashes, datas = blocks(4)
    store.put(NS.name, hashes, datas)
    writing, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:  # the registration's fsync waits for the test
        if threading.current_thread().name == "registrar":
            writing.set()
            release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    registrar = threading.Thread(
        target=store.register_namespace, args=(Namespace("slow", BLOCK),), name="registrar")
    registrar.start()
    try:
        assert writing.wait(10)
        done: list[Any] = []
        reader = threading.Thread(target=lambda: done.append(
            (store.get(NS.name, hashes), store.put(NS.name, *blocks(1)))))
        start = time.monotonic()
        reader.start()
        reader.join(5)
        assert done, "a get and a put waited for a registration's file write"
        assert done[0][0] == datas
        assert time.monotonic() - start < 5
    finally:
        release.set()
        registrar.join(10)
    assert "slow" in {ns.name for ns in store.namespaces()}
