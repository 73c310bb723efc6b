"""Pins held by socket get replies in flight count toward the tenant's pin quota. A get served
straight from the host slab pins its blocks until the kernel has taken the whole reply; a
client that never reads kept them pinned outside the quota (the report: a 64 MiB quota, 200
MiB of a 256 MiB host tier held). Past the quota a get is served by copy, within the frame
budget, and the tenant holds no more than its quota pinned."""

from __future__ import annotations

import hashlib
import socket
import time

import pytest

from kvstore.client import KVStoreClient, PinQuotaError
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash
from tests.security import dataplane_wire
from tests.security.dataplane_wire import MiB, call, frame, read_head, recv_exact

dp_server = dataplane_wire.dp_server  # the fixture, used by name

ADMIN, TOKEN_A, TOKEN_B = "admin-secret-0123", "tenant-a-secret-0123", "tenant-b-secret-0123"
QUOTA_BLOCKS = 8  # of 1 MiB
GET_BLOCKS = 8  # per get: a reply well past what the sockets' buffers take


def _hashes(salt: str, n: int) -> list[BlockHash]:
    return [BlockHash(hashlib.sha256(f"{salt}/{i}".encode()).digest()) for i in range(n)]


def _block(i: int) -> bytes:
    return bytes([i % 251]) * MiB


def _stalled(srv: ServerProc, token: str) -> socket.socket:
    """A connection (hello done) whose receive buffer is as small as the kernel allows: a
    reply sent to it stays in the server's buffers until read."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(20)
    s.connect(("127.0.0.1", srv.data_port))
    assert call(s, {"op": "hello", "id": 1, "token": token})["ok"] is True
    return s


def _pinned(admin: KVStoreClient) -> int:
    return int(admin.stats().totals.pinned)


def test_unread_get_replies_hold_no_more_than_the_pin_quota(dp_server) -> None:
    srv = dp_server("--token", ADMIN, "--tenant-tokens",
                    f'{{"a": "{TOKEN_A}", "b": "{TOKEN_B}"}}',
                    "--max-pinned-bytes-per-tenant", f"{QUOTA_BLOCKS}MiB",
                    "--frame-timeout-s", "30")
    hashes = _hashes("a", 4 * GET_BLOCKS + 1)
    with KVStoreClient(srv.url, TOKEN_A, use_shm=False) as a, \
            KVStoreClient(srv.url, TOKEN_B, use_shm=False) as b, \
            KVStoreClient(srv.url, ADMIN, use_shm=False) as admin:
        a.register_namespace("rp-a", MiB, {})
        b.register_namespace("rp-b", MiB, {})
        for i, key in enumerate(hashes):
            a.put("rp-a", [key], [_block(i)])
        b.put("rp-b", _hashes("b", 2), [_block(7), _block(8)])
        base = _pinned(admin)
        stalled = [_stalled(srv, TOKEN_A) for _ in range(4)]
        try:
            for n, s in enumerate(stalled):  # 32 MiB of replies nobody reads
                want = hashes[n * GET_BLOCKS:(n + 1) * GET_BLOCKS]
                s.sendall(frame({"op": "get", "id": 2, "ns": "rp-a", "hashes": want}))
            time.sleep(1.0)  # every get served, its reply stuck in the server's buffers
            held = _pinned(admin) - base
            assert held <= QUOTA_BLOCKS, \
                f"unread replies hold {held} MiB pinned past a {QUOTA_BLOCKS} MiB quota"
            # the first reply took the whole quota; its pins are the tenant's, so its own
            # pins find the quota taken
            assert held == QUOTA_BLOCKS
            with pytest.raises(PinQuotaError):
                a.pin("rp-a", hashes[-1:], lease_s=30)
            # another tenant's quota is its own
            assert b.pin("rp-b", _hashes("b", 2), lease_s=30) == [True, True]
            assert b.release("rp-b", _hashes("b", 2)) == 2
            for n, s in enumerate(stalled):  # every reply, pinned or copied, is right
                s.settimeout(30)
                assert _read_get(s) == [_block(i) for i in range(n * GET_BLOCKS,
                                                          (n + 1) * GET_BLOCKS)]
        finally:
            for s in stalled:
                s.close()
        deadline = time.monotonic() + 10
        while _pinned(admin) != base:  # sent: the pins went with the replies
            assert time.monotonic() < deadline, "pins outlived their replies"
            time.sleep(0.1)
        assert a.pin("rp-a", hashes[:QUOTA_BLOCKS], lease_s=30) == [True] * QUOTA_BLOCKS


def _read_get(s: socket.socket) -> list[bytes]:
    reply, plen = read_head(s)
    assert reply["ok"] is True, reply
    payload = recv_exact(s, plen)
    out, pos = [], 0
    for size in reply["sizes"]:
        out.append(payload[pos:pos + size])
        pos += size
    return out
