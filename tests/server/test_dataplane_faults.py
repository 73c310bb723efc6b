"""Bad input and misbehaving clients on the data plane: each gets an error frame or a clean
close, and the server keeps serving everyone else."""

from __future__ import annotations

import hashlib
import socket
import time
from typing import Any

import msgpack
import pytest

from kvstore.client import KVStoreClient
from kvstore.protocol.frame import PREFIX, encode_frame
from kvstore.testing.server import ServerProc

BLOCK = 4096


def connect(server: ServerProc) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.data_port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``s``, received into one buffer (no quadratic joining of chunks)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(view[got:])
        if not k:
            raise ConnectionResetError(f"closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def read_reply(s: socket.socket) -> dict[str, Any]:
    hlen, plen = PREFIX.unpack(recv_exact(s, 8))
    reply = msgpack.unpackb(recv_exact(s, hlen))
    recv_exact(s, plen)
    return reply


def send_raw(s: socket.socket, header_bytes: bytes, payload: bytes = b"") -> None:
    s.sendall(PREFIX.pack(len(header_bytes), len(payload)) + header_bytes + payload)


def call(s: socket.socket, header: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
    send_raw(s, msgpack.packb(header), payload)
    return read_reply(s)


def h(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def assert_serving(server: ServerProc, ns: str) -> None:
    """A fresh client still gets answers quickly."""
    start = time.monotonic()
    with connect(server) as s:
        assert call(s, {"op": "ping", "id": 1})["ok"] is True
        assert call(s, {"op": "lookup", "id": 2, "ns": ns, "hashes": [h(0)]})["ok"] is True
    assert time.monotonic() - start < 5


@pytest.fixture(scope="module")
def ns(server: ServerProc) -> str:
    with KVStoreClient(server.url) as c:
        c.register_namespace("faults", BLOCK, {})
    return "faults"


def test_bad_headers_get_error_frames_and_the_connection_goes_on(server, ns) -> None:
    with connect(server) as s:
        send_raw(s, b"\xc1\xc1")
        r = read_reply(s)
        assert r["ok"] is False and r["error"]["code"] == "bad_frame"
        send_raw(s, msgpack.packb([1, 2, 3]))
        assert read_reply(s)["error"]["code"] == "bad_frame"
        r = call(s, {"op": "nope", "id": 7})
        assert (r["id"], r["ok"], r["error"]["code"]) == (7, False, "unknown_op")
        assert "'nope'" in r["error"]["message"]
        assert call(s, {"id": 8})["error"]["code"] == "unknown_op"
        for bad in ({"op": "get", "ns": 5, "hashes": [h(1)]},
                    {"op": "get", "ns": ns, "hashes": "abc"},
                    {"op": "get", "ns": ns, "hashes": ["text-not-bytes"]},
                    {"op": "pin", "ns": ns, "hashes": [h(1)], "lease_s": "long"},
                    {"op": "put", "ns": ns, "hashes": [h(1)], "sizes": [BLOCK], "durable": 1}):
            r = call(s, {**bad, "id": 9})
            assert r["ok"] is False and r["error"]["code"] == "bad_request", (bad, r)
        r = call(s, {"op": "lookup", "id": 10, "ns": "nope", "hashes": [h(1)]})
        assert r["error"]["code"] == "unknown_namespace"
        r = call(s, {"op": "ping", "id": 11}, payload=b"xx")
        assert r["error"]["code"] == "bad_request"
        assert call(s, {"op": "ping", "id": 12})["ok"] is True


def test_wrong_sizes_store_nothing(server, ns) -> None:
    with connect(server) as s:
        r = call(s, {"op": "put", "id": 1, "ns": ns, "hashes": [h(100), h(101)],
                     "sizes": [BLOCK, BLOCK - 1]}, b"x" * (2 * BLOCK - 1))
        assert r["error"]["code"] == "block_size"
        r = call(s, {"op": "put", "id": 2, "ns": ns, "hashes": [h(100)], "sizes": [BLOCK]},
                 b"x" * (BLOCK + 1))
        assert r["error"]["code"] == "bad_request"
        assert call(s, {"op": "lookup", "id": 3, "ns": ns,
                        "hashes": [h(100), h(101)]})["prefix_blocks"] == 0


@pytest.mark.parametrize("prefix", [PREFIX.pack(64 << 20, 0), PREFIX.pack(10, 0xFFFFFFFF),
                                    PREFIX.pack(0, 0)])
def test_oversized_or_empty_frames_get_an_error_and_a_close(server, ns, prefix) -> None:
    with connect(server) as s:
        s.sendall(prefix)
        r = read_reply(s)
        assert r["ok"] is False and r["error"]["code"] in ("too_large", "bad_frame")
        assert s.recv(1) == b""  # closed: framing cannot be trusted any more
    assert_serving(server, ns)


def test_client_disconnecting_mid_put_leaves_nothing_visible(server, ns) -> None:
    head = msgpack.packb({"op": "put", "id": 1, "ns": ns, "hashes": [h(200), h(201)],
                          "sizes": [BLOCK, BLOCK]})
    with connect(server) as s:
        s.sendall(PREFIX.pack(len(head), 2 * BLOCK) + head + b"y" * (BLOCK + 10))
    with connect(server) as s:  # truncated inside the header too
        s.sendall(PREFIX.pack(len(head), 0) + head[:5])
    assert_serving(server, ns)
    with connect(server) as s:
        r = call(s, {"op": "lookup", "id": 2, "ns": ns, "hashes": [h(200), h(201)]})
        assert r["prefix_blocks"] == 0


def test_slowloris_does_not_block_others_and_is_cut_off(server, ns) -> None:
    stalled = []
    for _ in range(20):  # many stalled connections, each mid-frame
        s = connect(server)
        s.sendall(PREFIX.pack(40, 0)[:5])
        stalled.append(s)
    try:
        with KVStoreClient(server.url, use_shm=False) as c:
            start = time.monotonic()
            for i in range(20):
                assert c.put(ns, [h(300 + i)], [bytes([i]) * BLOCK]).stored == 1
                assert c.get(ns, [h(300 + i)]) == [bytes([i]) * BLOCK]
            assert time.monotonic() - start < 10
        # the server's frame timeout (2 s in this fixture) closes them
        stalled[0].settimeout(15)
        start = time.monotonic()
        assert stalled[0].recv(1) == b""
        assert time.monotonic() - start < 12
    finally:
        for s in stalled:
            s.close()


def test_unauthenticated_first_frame_is_refused_when_auth_is_on(make_server) -> None:
    srv = make_server("--token", "sekrit")
    with connect(srv) as s:
        r = call(s, {"op": "stats", "id": 1})
        assert r["error"]["code"] == "unauthenticated"
        assert s.recv(1) == b""
    with connect(srv) as s:
        assert call(s, {"op": "hello", "id": 1, "token": "sekrit"})["ok"] is True
        assert call(s, {"op": "stats", "id": 2})["ok"] is True


def test_raw_frames_match_encode_frame(server, ns) -> None:
    with connect(server) as s:
        pieces = encode_frame({"op": "put", "id": 3, "ns": ns, "hashes": [h(400)],
                               "sizes": [BLOCK]}, [b"z" * BLOCK])
        s.sendall(b"".join(bytes(p) for p in pieces))
        assert read_reply(s) == {"id": 3, "ok": True, "stored": 1, "existing": 0, "refused": 0}
