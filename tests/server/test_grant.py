"""Granted reads (``shm_lookup``): a lookup that pins the hit's host-resident blocks and hands
out their extents, so that another process copies them with no round trip of its own."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable

import pytest

from kvstore.client import KVStoreClient
from kvstore.client.socket_conn import FrameSocket
from kvstore.testing.server import ServerProc

BLOCK = 64 << 10


def _blocks(n: int, salt: str) -> tuple[list[bytes], list[bytes]]:
    hashes = [hashlib.sha256(f"{salt}/{i}".encode()).digest() for i in range(n)]
    return hashes, [os.urandom(BLOCK) for _ in range(n)]


def _pinned(c: KVStoreClient) -> int:
    return int(c.stats().totals.pinned)


def test_another_client_reads_granted_blocks_from_its_own_mapping(
    server: ServerProc, ns_name: str
) -> None:
    hashes, data = _blocks(6, ns_name)
    with KVStoreClient(server.url, use_shm=True) as sched, \
            KVStoreClient(server.url, use_shm=True) as worker:
        sched.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        sched.put(ns_name, hashes[:4], data[:4])
        base = _pinned(sched)
        grant = sched.lookup_acquire(ns_name, hashes, lease_s=30)
        assert grant.prefix_blocks == 4 and grant.tiers == ["host"] * 4
        assert all(e is not None for e in grant.extents) and len(grant.extents) == 4
        assert _pinned(sched) == base + 4
        slab = worker.mapped_slab(grant.instance)
        assert slab is not None
        assert [slab.read(e) for e in grant.extents if e is not None] == data[:4]
        assert grant.granted(hashes) == hashes[:4]
        assert sched.release_grant(ns_name, grant.granted(hashes)) == 4
        assert _pinned(sched) == base
        assert worker.mapped_slab("another-instance") is None


def test_blocks_held_only_below_the_host_tier_are_not_granted_or_promoted(
    make_server: Callable[..., ServerProc], ns_name: str
) -> None:
    # demotion in the put: a background demoter could move a block between the two lookups
    srv = make_server("--host-capacity", str(16 * BLOCK), "--no-background-demotion")
    hashes, data = _blocks(24, ns_name)
    with KVStoreClient(srv.url, use_shm=True) as c:
        c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        for i in range(0, 24, 4):  # oldest first: the first blocks go down to disk
            c.put(ns_name, hashes[i:i + 4], data[i:i + 4])
        tiers = c.lookup(ns_name, hashes)[1]
        assert "disk" in tiers and "host" in tiers
        gets = c.stats().totals.queries
        grant = c.lookup_acquire(ns_name, hashes)
        assert grant.prefix_blocks == 24 and grant.tiers == tiers
        assert [e is not None for e in grant.extents] == [t == "host" for t in tiers]
        assert c.lookup(ns_name, hashes)[1] == tiers  # nothing promoted
        # only the granted blocks count as reads
        assert c.stats().totals.queries - gets == tiers.count("host")
        slab = c.mapped_slab(grant.instance)
        assert slab is not None
        for ext, block in zip(grant.extents, data, strict=True):
            if ext is not None:
                assert slab.read(ext) == block
        c.release_grant(ns_name, grant.granted(hashes))


def test_without_shared_memory_a_grant_is_a_plain_lookup(server: ServerProc,
                                                          ns_name: str) -> None:
    hashes, data = _blocks(3, ns_name)
    with KVStoreClient(server.url, use_shm=False) as c:
        c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        c.put(ns_name, hashes[:2], data[:2])
        grant = c.lookup_acquire(ns_name, hashes)
        assert (grant.prefix_blocks, grant.extents, grant.instance) == (2, [None, None], "")
        assert grant.granted(hashes) == []
        assert c.mapped_slab("") is None


def test_bad_shm_lookup_frames_get_error_frames(server: ServerProc, ns_name: str) -> None:
    with KVStoreClient(server.url, use_shm=True) as c:
        c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        info = c._session()[1].info
    conn = FrameSocket.connect(info.target, 5)
    try:
        conn.request({"op": "hello", "owner": "granted"})
        for bad, code in [
            ({"op": "shm_lookup", "ns": ns_name, "hashes": [b"x"], "lease_s": "long"},
             "bad_request"),
            ({"op": "shm_lookup", "ns": ns_name, "hashes": "nope"}, "bad_request"),
            ({"op": "shm_lookup", "ns": "no-such-ns", "hashes": [b"x"]}, "unknown_namespace"),
        ]:
            with pytest.raises(Exception) as err:
                conn.request(bad)
            assert getattr(err.value, "code", None) == code, bad
        assert conn.request({"op": "ping"})[0]["ok"]  # the connection goes on
    finally:
        conn.close()


def test_grant_pins_outlive_the_granting_connection_until_their_lease(
    server: ServerProc, ns_name: str
) -> None:
    # The process copying a grant is not the one holding the connection: the granting
    # client's last connection closing must not free slots a worker is still copying at once
    # (they stay for grant_grace_s, 5 s by default, or until their shorter lease runs out).
    hashes, data = _blocks(3, ns_name)
    with KVStoreClient(server.url, use_shm=True) as watcher:
        watcher.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        watcher.put(ns_name, hashes, data)
        base = _pinned(watcher)
        sched = KVStoreClient(server.url, use_shm=True)
        grant = sched.lookup_acquire(ns_name, hashes[:2], lease_s=6.0)
        assert grant.granted(hashes[:2]) == hashes[:2]
        assert sched.pin(ns_name, hashes[2:], lease_s=30) == [True]  # goes with the connection
        assert _pinned(watcher) == base + 3
        sched.close()
        deadline = time.monotonic() + 5
        while _pinned(watcher) != base + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pinned(watcher) == base + 2  # the plain pin went, the grant stays
        deadline = time.monotonic() + 10
        while _pinned(watcher) != base and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pinned(watcher) == base  # until its lease ran out
