"""A socket get sent straight from the slab (server/dataplane/direct_get.py) keeps its pins
until the kernel has its bytes, whatever owner id another connection says hello with: the pins
are under an id no client can name, so no other connection can drop them (by ``release`` or by
closing) and hand the slots being sent to another tenant's blocks."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

from kvstore.testing.server import ServerProc

from .dataplane_wire import call, connect, dp_server, frame, h, hello, read_head, recv_exact

__all__ = ["dp_server"]  # the fixture, imported by name

BLOCK = 64 << 10
N = 200  # a reply of 12.5 MiB: more than the kernel buffers hold while the reader waits


def test_a_forged_owner_cannot_unpin_a_reply_being_sent(
        dp_server: Callable[..., ServerProc]) -> None:
    proc = dp_server("--token", "admin", "--frame-timeout-s", "30", host_capacity="64MiB",
                     env={"KVSTORE_TENANT_TOKENS": json.dumps({"a": "tok-a", "b": "tok-b"})})
    a_hashes, b_hashes = [h(i) for i in range(N)], [h(10_000 + i) for i in range(N)]
    with hello(proc, "tok-a") as a, hello(proc, "tok-b") as b, socket.socket() as reader:
        for s, name in ((a, "a-send"), (b, "b-send")):
            assert call(s, {"op": "register", "id": 2, "name": name, "block_bytes": BLOCK})["ok"]
        r = call(a, {"op": "put", "id": 3, "ns": "a-send", "hashes": a_hashes,
                     "sizes": [BLOCK] * N}, b"\xaa" * (N * BLOCK))
        assert r["stored"] == N, r
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing yet
        reader.connect(("127.0.0.1", proc.data_port))
        reader.settimeout(30)
        assert call(reader, {"op": "hello", "id": 1, "token": "tok-a", "owner": "reader"})["ok"]
        reader.sendall(frame({"op": "get", "id": 9, "ns": "a-send", "hashes": a_hashes}))
        time.sleep(0.5)  # the reply is being sent from the pinned slots
        for n in range(16):  # "a/reader" plus the suffix the server gave the send's pins
            with connect(proc) as forger:
                call(forger, {"op": "hello", "id": 1, "token": "tok-a",
                              "owner": f"reader#send{n}"})  # refused now: '#' in the owner
        time.sleep(1.0)  # the server drops each closed owner's pins in the background
        assert call(a, {"op": "delete_namespace", "id": 5, "name": "a-send"})["ok"]
        r = call(b, {"op": "put", "id": 4, "ns": "b-send", "hashes": b_hashes,
                     "sizes": [BLOCK] * N}, b"\xbb" * (N * BLOCK))
        assert r["stored"] == N, r
        reply, plen = read_head(reader)
        payload = recv_exact(reader, plen)
    assert reply["ok"] is True and plen == N * BLOCK, reply
    assert payload.count(b"\xbb") == 0, "tenant A was sent tenant B's bytes"
    assert payload == b"\xaa" * (N * BLOCK)


def test_an_owner_that_could_name_the_servers_own_pins_is_refused(
        dp_server: Callable[..., ServerProc]) -> None:
    """The server holds a client's shared-memory read pins and grants under its owner plus
    "#read" / "#grant": a connection saying hello as "victim#read" would, on closing, drop
    victim's read pins. An owner with '#', a space or a control character is refused."""
    proc = dp_server()
    for owner in ("victim#read", "victim#grant", "a b", "nul\x00", "ok/owner-1"):
        with connect(proc) as s:
            reply = call(s, {"op": "hello", "id": 1, "owner": owner})
        if owner == "ok/owner-1":
            assert reply["ok"] is True, reply
        else:
            assert reply["ok"] is False, (owner, reply)
            assert reply["error"]["code"] == "bad_request", (owner, reply)
            assert "field 'owner'" in reply["error"]["message"], reply
