"""The Python clients against a live server: shared memory and socket paths, threads,
asyncio, restarts and an unreachable server."""

from __future__ import annotations

import asyncio
import hashlib
import threading

import pytest

from kvstore.client import (
    AsyncKVStoreClient,
    BlockSizeError,
    KVStoreClient,
    KVStoreUnavailableError,
    NamespaceConflictError,
    UnknownNamespaceError,
)
from kvstore.testing.proc import free_port
from kvstore.testing.server import ServerProc
from kvstore.types import PutResult

BLOCK = 256 << 10  # spans several host slots: exercises multi-extent copies


def h(i: int, salt: str = "") -> bytes:
    return hashlib.sha256(f"{salt}{i}".encode()).digest()


def blk(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (BLOCK // 32)


@pytest.mark.parametrize("use_shm", [True, False])
def test_roundtrip_over_both_paths(server: ServerProc, ns_name: str, use_shm: bool) -> None:
    with KVStoreClient(server.url, use_shm=use_shm) as c:
        assert c.register_namespace(ns_name, BLOCK, {"model_id": "m"}).created is True
        assert c.register_namespace(ns_name, BLOCK, {"model_id": "m"}).created is False
        hashes = [h(i, ns_name) for i in range(12)]
        assert c.put(ns_name, hashes, [blk(i) for i in range(12)]) == \
            PutResult(12, 0, 0)
        assert c.shm_active is use_shm
        assert c.put(ns_name, hashes[:2], [blk(0), blk(1)]).existing == 2
        got = c.get(ns_name, [*hashes, h(99, ns_name)])
        assert got[:12] == [blk(i) for i in range(12)] and got[12] is None
        bufs = [bytearray(BLOCK) for _ in range(3)]
        assert c.get_into(ns_name, [hashes[0], h(98), hashes[2]], bufs) == [True, False, True]
        assert bufs[0] == blk(0) and bufs[2] == blk(2)
        assert c.lookup(ns_name, [*hashes[:3], h(97), hashes[4]]) == (3, ["host"] * 3)
        assert c.pin(ns_name, hashes[:2] + [h(96)], lease_s=5) == [True, True, False]
        assert c.release(ns_name, hashes[:2]) == 2
        # without waiting: no answer, but the frames run in order before the next call's
        assert c.pin(ns_name, hashes[:3], lease_s=5, wait=False) == []
        assert c.stats().totals.pinned == 3
        assert c.release(ns_name, hashes[:3], wait=False) == 0
        c.prefetch(ns_name, hashes[:3], wait=False)
        assert c.stats().totals.pinned == 0
        c.prefetch(ns_name, hashes[:3])
        assert c.delete(ns_name, hashes[:1]) == 1
        assert c.get(ns_name, hashes[:1]) == [None]
        stats = c.stats()
        assert stats.namespaces[ns_name].blocks == 11
        assert c.health().ok is True
        c.flush()


def test_client_errors_name_the_problem(server: ServerProc, ns_name: str) -> None:
    with KVStoreClient(server.url) as c:
        c.register_namespace(ns_name, 64, {})
        with pytest.raises(NamespaceConflictError):
            c.register_namespace(ns_name, 128, {})
        with pytest.raises(BlockSizeError):
            c.put(ns_name, [h(1)], [b"x" * 63])
        with pytest.raises(UnknownNamespaceError):
            c.get("missing-" + ns_name, [h(1)])
        with pytest.raises(ValueError):
            c.put(ns_name, [h(1)], [])
        assert c.lookup(ns_name, [h(1)]) == (0, [])


def test_unreachable_server_raises_connection_error() -> None:
    c = KVStoreClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(ConnectionError):
        c.stats()
    with pytest.raises(KVStoreUnavailableError):
        c.lookup("x", [h(1)])


def test_many_threads_share_one_client(server: ServerProc, ns_name: str) -> None:
    errors: list[BaseException] = []
    with KVStoreClient(server.url) as c:
        c.register_namespace(ns_name, BLOCK, {})

        def work(t: int) -> None:
            try:
                for i in range(5):
                    key = h(t * 100 + i, ns_name)
                    c.put(ns_name, [key], [blk(t * 100 + i)])
                    assert c.get(ns_name, [key]) == [blk(t * 100 + i)]
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_async_client(server: ServerProc, ns_name: str) -> None:
    async def main() -> None:
        async with AsyncKVStoreClient(server.url) as c:
            await c.register_namespace(ns_name, BLOCK, {})
            hashes = [h(i, ns_name) for i in range(8)]
            results = await asyncio.gather(*(c.put(ns_name, [k], [blk(i)])
                                             for i, k in enumerate(hashes)))
            assert sum(r.stored for r in results) == 8
            assert await c.get(ns_name, hashes) == [blk(i) for i in range(8)]
            assert await c.lookup(ns_name, hashes) == (8, ["host"] * 8)
            assert await c.pin(ns_name, hashes[:1]) == [True]
            assert await c.release(ns_name, hashes[:1]) == 1
            assert await c.pin(ns_name, hashes[:2], wait=False) == []  # no answer to wait for
            assert await c.release(ns_name, hashes[:2], wait=False) == 0
            await c.prefetch(ns_name, hashes, wait=False)
            assert await c.delete(ns_name, hashes[:1]) == 1
            await c.prefetch(ns_name, hashes)
            assert (await c.health()).ok
            assert ns_name in (await c.stats()).namespaces
        for use_shm in (True, False):
            async with AsyncKVStoreClient(server.url, use_shm=use_shm) as c:
                bufs = [bytearray(BLOCK) for _ in range(3)]
                got = await c.get_into(ns_name, [hashes[1], h(999), hashes[2]], bufs)
                assert got == [True, False, True] and bufs[0] == blk(1) and bufs[2] == blk(2)
        async with AsyncKVStoreClient(server.url, use_shm=False) as c:
            assert await c.get(ns_name, hashes[1:3]) == [blk(1), blk(2)]
            with pytest.raises(UnknownNamespaceError):
                await c.get("nope-" + ns_name, hashes[:1])

    asyncio.run(main())


def test_client_reconnects_after_restart(make_server, ns_name: str) -> None:
    srv = make_server()
    with KVStoreClient(srv.url) as c:
        c.register_namespace(ns_name, BLOCK, {})
        c.put(ns_name, [h(1)], [blk(1)])
        assert c.shm_active
        srv.restart()  # graceful: blocks spill to disk, the new slab is a new segment
        assert c.get(ns_name, [h(1)]) == [blk(1)]
        assert c.shm_active
        c.put(ns_name, [h(2)], [blk(2)])
        assert c.get(ns_name, [h(2)]) == [blk(2)]
        srv.stop()
        with pytest.raises(ConnectionError):
            c.get(ns_name, [h(1)])


def test_batches_larger_than_the_host_tier(server: ServerProc, ns_name: str) -> None:
    """96 MiB through a 64 MiB host tier: shm puts and gets go in slab-sized batches, blocks
    demoted to disk come back through the slab."""
    size = 1 << 20
    with KVStoreClient(server.url) as c:
        c.register_namespace(ns_name, size, {})
        hashes = [h(i, ns_name) for i in range(96)]
        data = [bytes([i]) * size for i in range(96)]
        assert c.put(ns_name, hashes, data).stored == 96
        assert c.shm_active
        assert "disk" in c.lookup(ns_name, hashes)[1]  # the host tier could not hold them all
        assert c.get(ns_name, hashes) == data



def test_a_local_get_into_a_small_buffer_names_the_problem(server: ServerProc,
                                                           ns_name: str) -> None:
    """A shared-memory get into a buffer smaller than the block is a BlockSizeError, its pins
    go, and the connection serves the next call; blocks copied into bytearrays (whose bytes
    start 16 bytes into a page, a copy the client may send through scratch) come back as
    stored."""
    hashes = [h(i, ns_name) for i in range(6)]
    with KVStoreClient(server.url, use_shm=True) as c:
        c.register_namespace(ns_name, BLOCK, {})
        c.put(ns_name, hashes, [blk(i) for i in range(6)])
        bufs = [bytearray(BLOCK) for _ in range(6)]
        assert c.get_into(ns_name, hashes, bufs) == [True] * 6
        assert bufs == [blk(i) for i in range(6)]
        bufs[2] = bytearray(16)
        with pytest.raises(BlockSizeError, match="cannot take a block"):
            c.get_into(ns_name, hashes, bufs)
        assert c.lookup(ns_name, hashes[:2]) == (2, ["host"] * 2)
        assert c.stats().totals.pinned == 0
