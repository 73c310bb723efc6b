"""The data plane takes no memory for a frame before its connection has
authenticated, and frames being received share one byte budget: a frame past it waits, then
is refused with a clear error frame."""

from __future__ import annotations

import socket
import time

from kvstore.client import KVStoreClient
from tests.security import dataplane_wire
from tests.security.dataplane_wire import (
    MiB,
    closed_within,
    connect,
    frame,
    h,
    hello,
    read_reply,
    rss_bytes,
)

dp_server = dataplane_wire.dp_server  # the fixture, used by name

TOKEN = "dp-secret"
BLOCK = 4096


def test_big_prefix_before_hello_is_refused_without_allocating(dp_server) -> None:
    srv = dp_server("--token", TOKEN, "--max-frame-bytes", "64MiB")
    before = rss_bytes(srv)
    socks: list[socket.socket] = []
    try:
        for _ in range(4):  # 17 bytes each claimed 256 MiB in the report; 64 MiB here
            s = connect(srv, timeout=3)
            s.sendall(frame({"op": "put"}, 64 * MiB))
            socks.append(s)
        time.sleep(1.0)
        grown = rss_bytes(srv) - before
        assert grown < 32 * MiB, f"server RSS grew {grown / MiB:.0f} MiB before any hello"
        for s in socks:
            reply = read_reply(s)
            assert reply["ok"] is False and reply["error"]["code"] == "too_large", reply
            assert "hello" in reply["error"]["message"]
            assert closed_within(s, 3)
    finally:
        for s in socks:
            s.close()
    with KVStoreClient(srv.url, token=TOKEN, use_shm=False) as c:  # still serving
        c.register_namespace("dp-mem", BLOCK, {})
        assert c.put("dp-mem", [h(1)], [b"a" * BLOCK]).stored == 1


def test_frames_past_the_budget_wait_for_room_then_get_busy(dp_server) -> None:
    # no shared memory: puts are read into buffers, not straight into the host slab
    srv = dp_server("--token", TOKEN, "--no-enable-shm", "--max-frame-bytes", "8MiB",
                      "--max-header-bytes", "1MiB", "--frame-budget-bytes", "20MiB",
                      "--frame-budget-wait-s", "1.5", "--frame-timeout-s", "5")
    with KVStoreClient(srv.url, token=TOKEN, use_shm=False) as c:
        c.register_namespace("dp-budget", MiB, {})
    put = {"op": "put", "id": 2, "ns": "dp-budget", "sizes": [MiB] * 8}
    before = rss_bytes(srv)
    socks = [hello(srv, TOKEN) for _ in range(4)]
    try:
        for i, s in enumerate(socks):  # 8 MiB frames announced, payloads held back
            s.sendall(frame({**put, "hashes": [h(100 * i + j) for j in range(8)]}, 8 * MiB))
            time.sleep(0.15)  # in this order: the waiters queue first come first served
        # two fit the 20 MiB budget; the third waits for room and gets it when one finishes
        socks[0].sendall(b"x" * 8 * MiB)
        assert read_reply(socks[0])["stored"] == 8
        # the fourth finds no room within its wait (1.5 s): a clear error, then a close
        reply = read_reply(socks[3])
        assert reply["ok"] is False and reply["error"]["code"] == "busy", reply
        assert "budget" in reply["error"]["message"]
        assert closed_within(socks[3], 3)
        socks[2].sendall(b"y" * 8 * MiB)  # the third got its room when the first finished
        reply = read_reply(socks[2])
        assert reply.get("stored") == 8, reply
        grown = rss_bytes(srv) - before
        assert grown < 40 * MiB, f"server RSS grew {grown / MiB:.0f} MiB over a 20 MiB budget"
    finally:
        for s in socks:
            s.close()
    with KVStoreClient(srv.url, token=TOKEN, use_shm=False) as c:  # and everyone else is served
        assert c.get("dp-budget", [h(0)]) == [b"x" * MiB]
