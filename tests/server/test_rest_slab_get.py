"""REST block GETs sent straight out of the host slab (server/rest/slab_body.py): the bytes
are the block's own, blocks held only below the host tier and misses come out as before, the
pin goes once the body has left, a block deleted while its body is on the way reaches the
reader intact, and a reader that stops reading is cut off and its pin goes."""

from __future__ import annotations

import http.client
import os
import socket
import time
from collections.abc import Callable

import pytest

from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc

from .test_dataplane_faults import h, recv_exact
from .test_direct_get import _pinned, _until_unpinned, two_tiers

BIG = 16 << 20  # more than the kernel buffers of both ends hold: the body waits on the server


def _get(srv: ServerProc, ns: str, key: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.request("GET", f"/v1/blocks/{ns}/{key.hex()}")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _stalled_reader(srv: ServerProc, ns: str, key: bytes) -> socket.socket:
    """A connection that asked for ``key`` and has read only the response's head."""
    reader = socket.create_connection(("127.0.0.1", srv.port))
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    reader.sendall(f"GET /v1/blocks/{ns}/{key.hex()} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += reader.recv(1)
    assert head.startswith(b"HTTP/1.1 200") and f"content-length: {BIG}".encode() in head
    return reader


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_rest_get_serves_slab_and_lower_tiers(
    make_server: Callable[..., ServerProc], loop: str,
) -> None:
    srv, data = two_tiers(make_server, loop, "rg")
    for i in range(8):
        assert _get(srv, "rg", h(i)) == (200, data[i])
    assert _get(srv, "rg", h(99))[0] == 404
    assert _until_unpinned(srv) == 0


def test_a_block_deleted_mid_body_reaches_the_reader_intact(
    make_server: Callable[..., ServerProc],
) -> None:
    srv = make_server("--frame-timeout-s", "20", host_capacity=f"{3 * BIG >> 20}MiB")
    data = os.urandom(BIG)
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace("rg", BIG, {})
        c.put("rg", [h(0)], [data])
    reader = _stalled_reader(srv, "rg", h(0))
    try:
        got = recv_exact(reader, 1 << 20)  # then stop reading: the rest waits on the server
        assert _pinned(srv) == 1
        with KVStoreClient(srv.url, use_shm=False) as other:
            assert other.delete("rg", [h(0)]) == 1
            other.put("rg", [h(1), h(2)], [os.urandom(BIG), os.urandom(BIG)])
        got += recv_exact(reader, BIG - len(got))
        assert got == data
    finally:
        reader.close()
    assert _until_unpinned(srv) == 0


def test_a_reader_that_never_reads_is_cut_off_and_its_pin_goes(
    make_server: Callable[..., ServerProc],
) -> None:
    srv = make_server("--frame-timeout-s", "2", host_capacity=f"{2 * BIG >> 20}MiB")
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace("rg", BIG, {})
        c.put("rg", [h(0)], [os.urandom(BIG)])
    reader = _stalled_reader(srv, "rg", h(0))
    try:
        time.sleep(0.5)
        assert _pinned(srv) == 1
        assert _until_unpinned(srv) == 0  # the body's deadline aborts the connection
        reader.settimeout(10)
        with pytest.raises(OSError):  # cut off: the body never completes
            recv_exact(reader, BIG)
    finally:
        reader.close()
    assert _get(srv, "rg", h(0))[0] == 200  # the server serves on
