"""The prefetch queue is bounded: hashes the store does not hold are never queued, and the
blocks queued for prefetch are limited per connection and over the whole server (overflow is
a ``busy`` error frame, or ``ServerBusyError`` in the client). The report: 600 frames of
65,536 unknown hashes took the server from 52 MiB to 4 GiB."""

from __future__ import annotations

import os
import socket
import time

import pytest

from kvstore.client import KVStoreClient, ServerBusyError
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


def _random_hashes(n: int) -> list[bytes]:
    pool = os.urandom(32 * n)
    return [pool[i:i + 32] for i in range(0, 32 * n, 32)]


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


def _prefetch(s: socket.socket, rid: int, hashes: list[bytes]) -> None:
    s.sendall(frame({"op": "prefetch", "id": rid, "ns": NS, "hashes": hashes}))


def test_the_queue_is_bounded_per_connection_and_overall(dp_server) -> None:
    srv = dp_server("--max-prefetch-blocks", "6000",
                    "--max-prefetch-blocks-per-connection", "4096")
    hashes = [h(i) for i in range(4096)]
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace(NS, 8192, {})
        for start in range(0, 4096, 512):
            c.put(NS, hashes[start:start + 512], [os.urandom(8192)] * 512)
    srv.restart()  # the blocks are on disk only now: each prefetch is real work, queued
    first, second = connect(srv), connect(srv)
    try:
        with KVStoreClient(srv.url, use_shm=False) as client:
            client.lookup(NS, hashes[:1])  # connected before the race below
            # one connection queues ~4,000 blocks at once, then at once asks for more
            _prefetch(first, 1, hashes)
            _prefetch(first, 2, hashes[:8])
            # another connection, and the official client, find the server's queue full
            _prefetch(second, 3, hashes[::-1])
            with pytest.raises(ServerBusyError, match="max_prefetch_blocks") as err:
                client.prefetch(NS, hashes[1:])
            assert err.value.code == "busy"
            assert read_reply(first)["ok"] is True
            again = read_reply(first)
            assert again["ok"] is False and again["error"]["code"] == "busy", again
            assert "max_prefetch_blocks_per_connection" in again["error"]["message"]
            other = read_reply(second)
            assert other["ok"] is False and other["error"]["code"] == "busy", other
            assert "max_prefetch_blocks" in other["error"]["message"]
            # the connections go on, and once the queue drains prefetches are taken again
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.prefetch(NS, hashes[:64])
                    break
                except ServerBusyError:
                    assert time.monotonic() < deadline, "the prefetch queue never drained"
                    time.sleep(0.2)
            assert call(first, {"op": "ping", "id": 4})["ok"] is True
            while client.lookup(NS, hashes[:64])[1] != ["host"] * 64:  # and it is done
                assert time.monotonic() < deadline, "the prefetch never ran"
                time.sleep(0.2)
    finally:
        first.close()
        second.close()
