"""The prefetch queue is bounded: hashes the store does not hold are never queued, and the
blocks queued for prefetch are limited per connection and over the whole server (overflow is
a ``busy`` error frame, or ``ServerBusyError`` in the client). The report: 600 frames of
65,536 unknown hashes took the server from 52 MiB to 4 GiB."""

from __future__ import annotations

import os
import socket
import time

import httpx

from kvstore.client import KVStoreClient, ServerBusyError
from kvstore.types import BlockHash
from tests.security import dataplane_wire
from tests.security.dataplane_wire import (
    MiB,
    call,
    connect,
    frame,
    h,
    read_reply,
    rss_bytes,
)

dp_server = dataplane_wire.dp_server  # the fixture, used by name

NS = "dp-prefetch"


def _random_hashes(n: int) -> list[BlockHash]:
    pool = os.urandom(32 * n)
    return [BlockHash(pool[i:i + 32]) for i in range(0, 32 * n, 32)]


def test_unknown_hashes_do_not_grow_the_server(dp_server) -> None:
    srv = dp_server()
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace(NS, 4096, {})
    before = rss_bytes(srv)
    peak = 0
    with connect(srv) as s:
        for i in range(24):  # 600 frames in the report: 24 grew the old server ~200 MiB
            s.sendall(frame({"op": "prefetch", "id": i, "ns": NS,
                             "hashes": _random_hashes(65536), "noreply": True}))
            if i % 8 == 7:
                peak = max(peak, rss_bytes(srv) - before)
        assert call(s, {"op": "ping", "id": 99})["ok"] is True  # every frame was served
        for _ in range(10):  # and what they queued (if anything) had time to pile up
            peak = max(peak, rss_bytes(srv) - before)
            time.sleep(0.1)
    assert peak < 64 * MiB, f"server RSS grew {peak / MiB:.0f} MiB for unknown hashes"


def _prefetch(s: socket.socket, rid: int, hashes: list[BlockHash]) -> None:
    s.sendall(frame({"op": "prefetch", "id": rid, "ns": NS, "hashes": hashes}))


def test_the_queue_is_bounded_per_connection_and_overall(dp_server) -> None:
    srv = dp_server("--max-prefetch-blocks", "2000",
                    "--max-prefetch-blocks-per-connection", "1500")
    hashes = [BlockHash(h(i)) for i in range(8192)]
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace(NS, 4096, {})
        for start in range(0, len(hashes), 1024):
            c.put(NS, hashes[start:start + 1024], [os.urandom(4096)] * 1024)
    srv.restart()  # the blocks are on disk only now: each prefetch is real work, queued
    conns = [connect(srv) for _ in range(8)]
    try:
        with KVStoreClient(srv.url, use_shm=False) as client:
            # more than a connection may have queued: refused whole, whatever is queued
            _prefetch(conns[0], 1, hashes[:1501])
            reply = read_reply(conns[0])
            assert reply["ok"] is False and reply["error"]["code"] == "busy", reply
            assert "max_prefetch_blocks_per_connection" in reply["error"]["message"]
            # more blocks than the whole queue holds, over REST: 503 busy, nothing queued
            rest = httpx.post(f"{srv.url}/v1/prefetch", timeout=30, json={
                "namespace": NS, "block_hashes": [x.hex() for x in hashes[-2001:]]})
            assert rest.status_code == 503, rest.text
            assert rest.json()["error"] == "busy", rest.json()
            # hashes the store does not hold are not queued: any number is taken
            client.prefetch(NS, _random_hashes(1500))
            # eight connections at once, 1,024 blocks each, against 2,000 for everyone
            for n, s in enumerate(conns):
                _prefetch(s, 2, hashes[n * 1024:(n + 1) * 1024])
            replies = [read_reply(s) for s in conns]
            refused = [r for r in replies if not r["ok"]]
            assert refused, "eight prefetches of 1,024 blocks all queued past a 2,000 bound"
            for r in refused:
                assert r["error"]["code"] == "busy", r
                assert "max_prefetch_blocks (2000)" in r["error"]["message"]
            # the connections go on, and once the queue drains prefetches are taken again
            deadline = time.monotonic() + 60
            first = next(n for n, r in enumerate(replies) if not r["ok"])
            want = hashes[first * 1024:first * 1024 + 64]  # not queued: still on disk
            while True:
                try:
                    client.prefetch(NS, want)
                    break
                except ServerBusyError as exc:
                    assert exc.code == "busy"
                    assert time.monotonic() < deadline, "the prefetch queue never drained"
                    time.sleep(0.2)
            assert all(call(s, {"op": "ping", "id": 4})["ok"] for s in conns)
            while client.lookup(NS, want)[1] != ["host"] * 64:  # and it is done
                assert time.monotonic() < deadline, "the prefetch never ran"
                time.sleep(0.2)
    finally:
        for s in conns:
            s.close()
