"""Fixtures for store tests: real host (shared memory), device (torch on cpu) and disk (LMDB)
tiers in a temp folder."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Layout, Namespace
from kvstore.store import Store
from kvstore.tiers.slots import Extents

BLOCK = 4096  # bytes per block in these tests: small, so that tests move many blocks
NS = Namespace("m", BLOCK, Layout(model_id="tiny", num_layers=2, block_size=16, dtype="f32"))

StoreFactory = Callable[..., Store]


def blocks(n: int, size: int = BLOCK) -> tuple[list[bytes], list[bytes]]:
    """``n`` random hashes and blocks."""
    return [os.urandom(32) for _ in range(n)], [os.urandom(size) for _ in range(n)]


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[StoreFactory]:
    """Build stores over real tiers: ``make_store(host=8, disk=64, device=0, **cfg)`` where the
    tier sizes are in blocks (0 = no such tier). Every store is closed at the end."""
    made: list[Store] = []

    def factory(
        host: int = 8,
        disk: int = 64,
        device: int = 0,
        *,
        host_policy: str = "lru",
        host_watermarks: tuple[float, float] = (0.85, 0.95),
        disk_admission: str = "always",
        disk_write_through: bool = False,
        path: Path | None = None,
        register: bool = True,
        **cfg: Any,
    ) -> Store:
        folder = path or tmp_path
        tiers = []
        if device:
            tiers.append(TierConfig("device", device * BLOCK, options={"device": "cpu",
                                                                        "slot_bytes": BLOCK}))
        if host:
            low, high = host_watermarks
            tiers.append(TierConfig("host", host * BLOCK, policy=host_policy,
                                    low_watermark=low, high_watermark=high,
                                    options={"slot_bytes": BLOCK}))
        if disk:
            tiers.append(TierConfig("disk", disk * BLOCK, admission=disk_admission,
                                    write_through=disk_write_through,
                                    options={"path": str(folder / "lmdb")}))
        store = Store(StoreConfig(tuple(tiers), namespaces_path=str(folder / "ns.json"), **cfg))
        made.append(store)
        if register:
            store.register_namespace(NS)
        return store

    yield factory
    for store in made:
        store.close()


def slab_copy(store: Store, extents: Extents) -> bytes:
    """The bytes at ``extents`` of the host slab, as a reader mapping it copies them."""
    view = store.tier("host").view(0, store.tier("host").slab_bytes)  # type: ignore[attr-defined]
    try:
        return b"".join(bytes(view[off:off + n]) for off, n in extents)
    finally:
        view.release()


def fenced_copy(store: Store, extents: Extents, gen: int | None) -> bytes | None:
    """What a shared-memory client gets: the copy, or None (a miss) if the generation it was
    handed moved by the end of the copy (``kvstore.client.shm.SlabMapping.read``)."""
    data = slab_copy(store, extents)
    return data if store.tier("host").generations([extents]) == [gen] else None
