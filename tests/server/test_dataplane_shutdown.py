"""A graceful stop (SIGTERM) delivers the replies the data plane has already answered: a
client that was slow to read a large get's reply still receives every byte of it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import msgpack

from kvstore.client import KVStoreClient
from kvstore.protocol.frame import PREFIX
from kvstore.testing.server import ServerProc
from tests.server.test_dataplane_faults import h, recv_exact, send_raw

BLOCK = 1 << 20
BLOCKS = 48


def test_a_reply_buffered_at_shutdown_is_delivered_whole(
    make_server: Callable[..., ServerProc],
) -> None:
    srv = make_server("--host-capacity", "128MiB")
    hashes = [h(i) for i in range(BLOCKS)]
    data = [bytes([i]) * BLOCK for i in range(BLOCKS)]
    with KVStoreClient(srv.url) as c:
        c.register_namespace("slow", BLOCK, {})
        assert c.put("slow", hashes, data).stored == BLOCKS
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # the kernel holds little
    s.settimeout(30)
    s.connect(("127.0.0.1", srv.data_port))
    try:
        send_raw(s, msgpack.packb({"op": "get", "id": 1, "ns": "slow", "hashes": hashes}))
        first = recv_exact(s, 8)  # the reply has started: the rest waits in the server
        stopper = threading.Thread(target=srv.stop)  # SIGTERM, then wait for the exit
        stopper.start()
        stopper.join(1.0)  # the server is shutting down while the client has not read
        hlen, plen = PREFIX.unpack(first)
        header = msgpack.unpackb(recv_exact(s, hlen))
        assert header["ok"] is True
        payload = recv_exact(s, plen)
        assert payload == b"".join(data)
        stopper.join(60)
        assert not stopper.is_alive()
    finally:
        s.close()
