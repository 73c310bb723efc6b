"""Who hashes a block that a socket get sends straight from the slab. A client that says it
checks what lands (``checked``, as ``KVStoreClient`` does) and that the server trusts with
the slab gets the bytes as they lie, without the server hashing them first: the client's
connection catches bytes that differ from the reply's checksum, the block is a miss, and the
client reports it (``check``) so the server drops it (cause ``client``). A get without
``checked``, and every get of a tenant on a server with tenant tokens, is hashed by the server
before sending (cause ``send``): a tenant never receives bytes a stray writer left in a place
of its block."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from kvstore.client import KVStoreClient
from kvstore.client.exchange import Call, Link, Steps
from kvstore.protocol import Get, GetReply
from kvstore.testing.server import ServerProc
from tests.security import dataplane_wire
from tests.security.shm_steps import BLOCK, blocks, flip

dp_server = dataplane_wire.dp_server  # the fixture, used by name

ADMIN, TOKEN_A = "admin-secret-0123", "tenant-a-secret-0123"


def _get_raw(link: Link, ns: str, hashes: list[bytes],
             checked: bool) -> Steps[tuple[GetReply, list[Any]]]:
    header, part = yield Call(Get(ns, hashes, checked=checked))
    return GetReply.from_header(header), part


def _corrupt(server: ServerProc, token: str | None = None) -> dict[str, int]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    doc = httpx.get(server.url + "/v1/stats", headers=headers, timeout=10).json()
    by_cause: dict[str, int] = doc["tiers"]["host"].get("corrupt_by_cause", {})
    return by_cause


def test_a_trusted_checked_get_is_checked_by_the_client_and_reported(
        dp_server: Callable[..., ServerProc]) -> None:
    srv = dp_server()
    with KVStoreClient(srv.url, use_shm=True) as shm, \
            KVStoreClient(srv.url, use_shm=False) as sock:
        sock.register_namespace("cg", BLOCK, {"model_id": "m"})
        hashes, data = blocks(3, "cg")
        assert sock.put("cg", hashes, data).stored == 3
        flip(shm, "cg", hashes[:2])
        before = _corrupt(srv)
        # checked: the server sends the bytes as they lie, the connection finds them wrong
        reply, part = sock._run(_get_raw, "cg", hashes[:1], True)
        assert reply.sizes == [BLOCK] and part == [None]
        # not checked (a client that does not hash what lands): the server hashes first
        reply, part = sock._run(_get_raw, "cg", hashes[1:2], False)
        assert reply.sizes == [-1] and part == [None]
        assert _corrupt(srv).get("send", 0) == before.get("send", 0) + 1
        # the client's own get reports what failed; the server drops it
        assert sock.get("cg", hashes) == [None, None, data[2]]
        time.sleep(0.5)  # check goes without waiting for a reply
        assert _corrupt(srv).get("client", 0) == before.get("client", 0) + 1
        reply, _ = sock._run(_get_raw, "cg", hashes[:1], True)
        assert reply.sizes == [-1]  # dropped from the store
        assert sock.get_into("cg", hashes[2:], [bytearray(BLOCK)]) == [True]


def test_a_tenants_checked_get_is_still_hashed_by_the_server(
        dp_server: Callable[..., ServerProc]) -> None:
    srv = dp_server("--token", ADMIN, "--tenant-tokens", f'{{"a": "{TOKEN_A}"}}')
    with KVStoreClient(srv.url, ADMIN, use_shm=True) as admin, \
            KVStoreClient(srv.url, TOKEN_A, use_shm=False) as tenant:
        tenant.register_namespace("cg", BLOCK, {"model_id": "m"})
        hashes, data = blocks(2, "cg-tenant")
        assert tenant.put("cg", hashes, data).stored == 2
        flip(admin, "a~cg", hashes[:1])  # the admin names a tenant's namespace tenant~name
        before = _corrupt(srv, ADMIN)
        reply, part = tenant._run(_get_raw, "cg", hashes, True)
        assert reply.sizes == [-1, BLOCK] and part == [None, data[1]]
        assert _corrupt(srv, ADMIN).get("send", 0) == before.get("send", 0) + 1
