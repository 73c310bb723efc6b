"""Places a server-fed writer receives into stay its own until it is done: a socket put
received straight into host-slab places (server/dataplane/direct_put.py) keeps them while its
payload may still arrive, whatever deletes the namespace meanwhile. The late bytes never
reach another tenant's acknowledged blocks, the late commit is refused, and once the writer
is done every slot it held is free again."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc

from .dataplane_wire import call, connect, frame, h, hello, read_head, read_reply, recv_exact

ADMIN, TOK_A, TOK_B = "recv-admin", "recv-tenant-a", "recv-tenant-b"
BLOCK = 64 << 10
N = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """Two tenants and an admin; a host tier of 256 slots (the freed slots of one put are the
    next put's: the allocator is a stack)."""
    data = tmp_path_factory.mktemp("recv-fence") / "data"
    proc = ServerProc(data, "--token", ADMIN, "--frame-timeout-s", "30",
                      env={"KVSTORE_TENANT_TOKENS": json.dumps({"a": TOK_A, "b": TOK_B})},
                      host_capacity="16MiB")
    proc.start()
    yield proc
    proc.stop()


def _host_bytes(proc: ServerProc) -> int:
    """What the host tier charges (stored and reserved slots), as the admin sees it."""
    with KVStoreClient(proc.url, token=ADMIN) as admin:
        return int(admin.stats().tiers["host"].bytes)


def _until_host_bytes(proc: ServerProc, want: int) -> int:
    deadline = time.monotonic() + 15
    while (got := _host_bytes(proc)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def _register(s: socket.socket, name: str) -> None:
    reply = call(s, {"op": "register", "id": 2, "name": name, "block_bytes": BLOCK})
    assert reply["ok"] is True, reply


def _get(s: socket.socket, ns: str, hashes: list[bytes]) -> list[bytes | None]:
    s.sendall(frame({"op": "get", "id": 9, "ns": ns, "hashes": hashes}))
    reply, plen = read_head(s)
    assert reply["ok"] is True, reply
    payload = recv_exact(s, plen)
    out: list[bytes | None] = []
    at = 0
    for size in reply["sizes"]:
        out.append(None if size < 0 else payload[at:at + size])
        at += max(size, 0)
    return out


def _overwrite_attempt(proc: ServerProc, tag: str,
                       delete: Any) -> tuple[dict[str, Any], list[bytes | None], list[bytes]]:
    """Tenant A starts a put of N blocks straight into the slab (1 payload byte sent); then
    ``delete(ns)`` removes A's namespace; tenant B puts N blocks; A sends the rest. Returns
    A's put reply, what B reads back, and what B stored."""
    before = _host_bytes(proc)
    ns_a, ns_b = f"a-{tag}", f"b-{tag}"
    a_hashes = [h(1000 + i) for i in range(N)]
    b_hashes = [h(2000 + i) for i in range(N)]
    b_data = [os.urandom(BLOCK) for _ in range(N)]
    with hello(proc, TOK_A) as a_put, hello(proc, TOK_B) as b:
        _register(a_put, ns_a)
        _register(b, ns_b)
        head = frame({"op": "put", "id": 3, "ns": ns_a, "hashes": a_hashes,
                      "sizes": [BLOCK] * N}, N * BLOCK)
        a_put.sendall(head + b"\xaa")
        # the header is in: the server reserved A's places and receives into them
        assert _until_host_bytes(proc, before + N * BLOCK) == before + N * BLOCK
        delete(ns_a)
        reply = call(b, {"op": "put", "id": 4, "ns": ns_b, "hashes": b_hashes,
                         "sizes": [BLOCK] * N}, b"".join(b_data))
        assert reply["ok"] is True and reply["stored"] == N, reply  # acknowledged
        a_put.sendall(b"\xaa" * (N * BLOCK - 1))
        a_reply = read_reply(a_put)
        got = _get(b, ns_b, b_hashes)
    return a_reply, got, b_data


def _delete_over_socket(proc: ServerProc, token: str) -> Any:
    def delete(ns: str) -> None:
        with hello(proc, token) as s:
            reply = call(s, {"op": "delete_namespace", "id": 5, "name": ns})
            assert reply["ok"] is True, reply
    return delete


def _check_refused_and_intact(proc: ServerProc, a_reply: dict[str, Any],
                              got: list[bytes | None], b_data: list[bytes]) -> None:
    assert a_reply.get("stored", 0) == 0, a_reply  # A's late commit is refused
    correct = sum(g == d for g, d in zip(got, b_data, strict=True))
    assert correct == N, f"tenant B reads {correct}/{N} of its blocks correct"
    # once A's put is done its places are free again: only B's blocks are charged
    with KVStoreClient(proc.url, token=ADMIN) as admin:
        stored = int(admin.stats().totals.blocks)
    assert _until_host_bytes(proc, stored * BLOCK) == stored * BLOCK


def test_tenant_deleting_its_namespace_mid_put_cannot_overwrite_another_tenant(
        server: ServerProc) -> None:
    a_reply, got, b_data = _overwrite_attempt(server, "tenant", _delete_over_socket(server, TOK_A))
    _check_refused_and_intact(server, a_reply, got, b_data)


def test_admin_deleting_a_namespace_mid_put_cannot_overwrite_another_tenant(
        server: ServerProc) -> None:
    def delete(ns: str) -> None:  # the admin names tenant a's namespace "a~NAME"
        r = httpx.delete(f"{server.url}/v1/namespaces/a~{ns}",
                         headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        assert r.status_code == 200, r.text

    a_reply, got, b_data = _overwrite_attempt(server, "admin", delete)
    _check_refused_and_intact(server, a_reply, got, b_data)


def test_another_connection_naming_the_puts_owner_cannot_free_its_places(
        server: ServerProc) -> None:
    """Owner expiry: a connection of tenant A that says hello with the owner id the server
    gives a socket put in flight (its session's owner plus a suffix) and closes, so that the
    server drops that owner's leases and reservations. The put keeps its places, stores its
    blocks, and tenant B's blocks stored meanwhile are untouched."""
    before = _host_bytes(server)
    ns_a, ns_b = "a-owner", "b-owner"
    a_hashes, b_hashes = [h(3000 + i) for i in range(N)], [h(4000 + i) for i in range(N)]
    a_data = [bytes([i]) * BLOCK for i in range(N)]
    b_data = [os.urandom(BLOCK) for _ in range(N)]
    a_put = connect(server)
    with a_put, hello(server, TOK_B) as b:
        assert call(a_put, {"op": "hello", "id": 1, "token": TOK_A, "owner": "victim"})["ok"]
        _register(a_put, ns_a)
        _register(b, ns_b)
        payload = b"".join(a_data)
        a_put.sendall(frame({"op": "put", "id": 3, "ns": ns_a, "hashes": a_hashes,
                             "sizes": [BLOCK] * N}, N * BLOCK) + payload[:1])
        assert _until_host_bytes(server, before + N * BLOCK) == before + N * BLOCK
        for n in range(64):  # the server numbers its puts: try the first 64
            with connect(server) as forger:
                # refused now ('#' is not allowed in an owner); the put's id is not a
                # suffix of the session's owner either way
                call(forger, {"op": "hello", "id": 1, "token": TOK_A,
                              "owner": f"victim#recv{n}"})
        time.sleep(1.0)  # the server drops each closed owner's leases in the background
        reply = call(b, {"op": "put", "id": 4, "ns": ns_b, "hashes": b_hashes,
                         "sizes": [BLOCK] * N}, b"".join(b_data))
        assert reply["ok"] is True and reply["stored"] == N, reply
        a_put.sendall(payload[1:])
        a_reply = read_reply(a_put)
        got_b = _get(b, ns_b, b_hashes)
        got_a = _get(a_put, ns_a, a_hashes)
    correct = sum(g == d for g, d in zip(got_b, b_data, strict=True))
    assert correct == N, f"tenant B reads {correct}/{N} of its blocks correct"
    assert a_reply["stored"] == N, a_reply  # nothing ended A's put: it is stored whole
    assert got_a == a_data


def test_put_cut_off_after_its_namespace_went_frees_every_place(server: ServerProc) -> None:
    """The writer never finishes: its connection drops mid-payload after the delete. Its
    places go back to the free list then, not before and never twice."""
    before = _host_bytes(server)
    ns = "a-cut"
    with hello(server, TOK_A) as a_put:
        _register(a_put, ns)
        a_put.sendall(frame({"op": "put", "id": 3, "ns": ns, "hashes": [h(i) for i in range(N)],
                             "sizes": [BLOCK] * N}, N * BLOCK) + b"\xaa" * BLOCK)
        assert _until_host_bytes(server, before + N * BLOCK) == before + N * BLOCK
        _delete_over_socket(server, TOK_A)(ns)
        # still receiving: the doomed places stay charged until the receive ends
        time.sleep(0.3)
        assert _host_bytes(server) == before + N * BLOCK
    assert _until_host_bytes(server, before) == before
