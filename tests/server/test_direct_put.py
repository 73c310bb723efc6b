"""Socket puts read straight into host-slab places (server/dataplane/direct_put.py): stored
byte for byte, blocks already stored keep their bytes, and a frame that never completes frees
its places."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import msgpack

from kvstore.client import KVStoreClient
from kvstore.protocol.frame import PREFIX
from kvstore.testing.server import ServerProc

from .test_dataplane_faults import call, connect, h, read_reply

BLOCK = 64 << 10


def _host_bytes(srv: ServerProc) -> int:
    with KVStoreClient(srv.url) as c:
        return int(c.stats().tiers["host"].bytes)


def _until_host_bytes(srv: ServerProc, want: int) -> int:
    deadline = time.monotonic() + 10
    while (got := _host_bytes(srv)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def _server(make_server: Callable[..., ServerProc]) -> ServerProc:
    srv = make_server("--frame-timeout-s", "2")
    with KVStoreClient(srv.url) as c:
        c.register_namespace("direct", BLOCK, {})
    return srv


def test_socket_put_lands_byte_identical_and_keeps_stored_bytes(
    make_server: Callable[..., ServerProc],
) -> None:
    srv = _server(make_server)
    data = [os.urandom(BLOCK) for _ in range(4)]
    with connect(srv) as s:
        r = call(s, {"op": "put", "id": 1, "ns": "direct", "hashes": [h(0), h(1)],
                     "sizes": [BLOCK] * 2}, data[0] + data[1])
        assert (r["stored"], r["existing"]) == (2, 0)
        # h(1) again with other bytes: it is stored already and keeps its bytes
        r = call(s, {"op": "put", "id": 2, "ns": "direct", "hashes": [h(1), h(2), h(3)],
                     "sizes": [BLOCK] * 3}, os.urandom(BLOCK) + data[2] + data[3])
        assert (r["stored"], r["existing"], r["refused"]) == (2, 1, 0)
        # the same hash twice in one frame: served the usual way, stored once
        r = call(s, {"op": "put", "id": 3, "ns": "direct", "hashes": [h(4), h(4)],
                     "sizes": [BLOCK] * 2}, data[0] + data[0])
        assert (r["stored"], r["existing"]) == (1, 1)
    with KVStoreClient(srv.url, use_shm=False) as c:
        assert c.get("direct", [h(i) for i in range(5)]) == [*data, data[0]]
    assert _host_bytes(srv) == 5 * BLOCK  # nothing left reserved


def test_frames_that_never_complete_free_their_places(
    make_server: Callable[..., ServerProc],
) -> None:
    srv = _server(make_server)
    head = msgpack.packb({"op": "put", "id": 1, "ns": "direct", "hashes": [h(10), h(11)],
                          "sizes": [BLOCK, BLOCK]})
    with connect(srv) as s:  # disconnects halfway through the second block
        s.sendall(PREFIX.pack(len(head), 2 * BLOCK) + head + b"y" * (BLOCK + 100))
    assert _until_host_bytes(srv, 0) == 0
    stalled = connect(srv)  # stalls halfway: the frame timeout (2 s) cuts it off
    try:
        stalled.sendall(PREFIX.pack(len(head), 2 * BLOCK) + head + b"z" * 100)
        stalled.settimeout(15)
        assert stalled.recv(1) == b""
    finally:
        stalled.close()
    assert _until_host_bytes(srv, 0) == 0
    with connect(srv) as s:
        r = call(s, {"op": "lookup", "id": 2, "ns": "direct", "hashes": [h(10), h(11)]})
        assert r["prefix_blocks"] == 0
        data = os.urandom(2 * BLOCK)  # the same blocks, sent whole, now store fine
        r = call(s, {"op": "put", "id": 3, "ns": "direct", "hashes": [h(10), h(11)],
                     "sizes": [BLOCK] * 2}, data)
        assert r["stored"] == 2
    with KVStoreClient(srv.url, use_shm=False) as c:
        assert b"".join(c.get("direct", [h(10), h(11)])) == data


def test_a_slow_frame_keeps_its_places_past_the_default_lease(
    make_server: Callable[..., ServerProc],
) -> None:
    """The server receives a frame's payload into its places until the frame completes or
    times out: the reservation must last that long, whatever the default lease. Were it
    freed before (a default lease shorter than the frame timeout), the slots would go to
    another put, stored and acknowledged, and the rest of the slow payload land on it."""
    srv = make_server("--frame-timeout-s", "6", "--lease-s", "0.5")
    with KVStoreClient(srv.url) as c:
        c.register_namespace("direct", BLOCK, {})
    head = msgpack.packb({"op": "put", "id": 1, "ns": "direct", "hashes": [h(20), h(21)],
                          "sizes": [BLOCK, BLOCK]})
    theirs, their_data = [h(30), h(31)], [os.urandom(BLOCK) for _ in range(2)]
    with connect(srv) as slow:
        slow.sendall(PREFIX.pack(len(head), 2 * BLOCK) + head + b"s" * (BLOCK // 2))
        time.sleep(2.5)  # past the default lease, and the reaper (every second) ran
        with KVStoreClient(srv.url, use_shm=False) as other:  # takes the slots freed last
            assert other.put("direct", theirs, their_data).stored == 2
        slow.sendall(b"s" * (BLOCK + BLOCK // 2))  # the rest of the slow frame
        slow.settimeout(10)
        reply = read_reply(slow)
    with KVStoreClient(srv.url, use_shm=False) as c:
        assert c.get("direct", theirs) == their_data  # acknowledged blocks untouched
        assert reply["stored"] == 2  # its places held: it completes
        assert c.get("direct", [h(20), h(21)]) == [b"s" * BLOCK] * 2
