"""StoreLink against a real kvstore server: the rules for a server that is down, restarts,
forgets its namespaces or holds them with another identity."""

from __future__ import annotations

import time
from typing import Any

import pytest

from connectors.vllm.config import ConnectorConfig
from connectors.vllm.store_link import NamespaceMismatch, StoreLink, StoreUnavailable

BLOCK_BYTES = 4096
LAYOUT = {"model_id": "m", "num_layers": 1, "block_size": 32, "dtype": "float32"}
HASHES = [bytes([i]) * 32 for i in range(4)]
BLOCKS = [bytes([i]) * BLOCK_BYTES for i in range(4)]


def _link(server: Any, **kw: Any) -> StoreLink:
    cfg = ConnectorConfig(server.url, timeout_s=2.0, retry_after_s=0.5)
    args: dict[str, Any] = {"layout": LAYOUT, "hash_algo": "sha256", "hash_seed": None} | kw
    return StoreLink(cfg, "vllm.test", BLOCK_BYTES, **args)


def test_put_lookup_get_round_trip(server: Any) -> None:
    link = _link(server)
    assert link.register()
    assert link.put(HASHES[:3], [memoryview(b) for b in BLOCKS[:3]])
    n, tiers = link.lookup_tiers(HASHES)
    assert n == 3 and len(tiers) == 3
    assert link.get(HASHES) == [*BLOCKS[:3], None]
    link.pin(HASHES[:3])
    link.release(HASHES[:3])
    link.close()


def test_another_seed_for_the_same_namespace_fails_loudly(server: Any) -> None:
    assert _link(server).register()
    with pytest.raises(NamespaceMismatch, match="seed"):
        _link(server, hash_seed="42").register()
    with pytest.raises(NamespaceMismatch):
        _link(server, layout={**LAYOUT, "dtype": "bfloat16"}).lookup_tiers(HASHES)


def test_down_server_is_a_fast_miss_then_recovers_after_restart(server: Any) -> None:
    link = _link(server)
    assert link.put(HASHES[:2], BLOCKS[:2])
    server.stop()

    start = time.monotonic()
    assert link.lookup_tiers(HASHES) == (0, [])
    with pytest.raises(StoreUnavailable):
        link.get(HASHES[:1])
    assert not link.put(HASHES[2:3], BLOCKS[2:3])
    assert not link.available  # calls now skip the network until retry_after_s passed
    assert time.monotonic() - start < 5

    server.start()  # same data folder: the blocks spilled to disk on the clean stop
    time.sleep(0.6)
    assert link.available
    assert link.lookup_tiers(HASHES)[0] == 2
    assert link.get(HASHES[:2]) == BLOCKS[:2]


def test_forgotten_namespace_is_registered_again(server: Any, tmp_path: Any) -> None:
    link = _link(server)
    assert link.put(HASHES[:1], BLOCKS[:1])
    server.stop()
    # A restart without the old data folder: the server knows nothing of the namespace.
    server.data_dir = tmp_path / "fresh"
    server.start()
    time.sleep(0.6)
    assert link.put(HASHES[1:2], BLOCKS[1:2])
    assert link.get(HASHES[:2]) == [None, BLOCKS[1]]


def _pinned(server: Any) -> int:
    from kvstore.client import KVStoreClient

    with KVStoreClient(server.url) as c:
        return int(c.stats().totals.pinned)


def test_grants_taken_before_a_reconnect_are_released_after_it(server: Any) -> None:
    # A timed-out call drops the link's client; the next call builds a new one. The grant's
    # pins outlive the old client's connections (a worker may be copying them), so the new
    # client must be able to release them: both are the same owner to the server.
    link = _link(server)
    assert link.put(HASHES, BLOCKS)
    base = _pinned(server)
    grant = link.lookup_grant(HASHES)
    assert grant.prefix_blocks == 4 and grant.granted(HASHES) == HASHES  # all in RAM
    assert _pinned(server) == base + 4

    def times_out(client: Any) -> None:
        raise TimeoutError("the store answered too late")

    with pytest.raises(StoreUnavailable):
        link._call(times_out)
    assert not link.available
    time.sleep(0.6)  # retry_after_s
    link.release_grant(HASHES)
    deadline = time.monotonic() + 5
    while _pinned(server) != base and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pinned(server) == base  # not held until the lease (60 s) runs out
    link.close()
