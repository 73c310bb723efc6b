"""REST bodies in time and per tenant: an authenticated tenant trickling its uploads (a byte
every half second) neither locks the other tenants out of requests with a body (its share of
the body budget is bounded, 429 past it) nor holds its share for ever (408 once the body
deadline passes, and the share comes back); a client that leaves in the middle of its body is
a debug line, not a traceback, and what its request held is given back.

The new settings are given as ``KVSTORE_*`` variables, so that a server without them starts
too and fails on what it does."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from kvstore.testing.server import ServerProc

TOKENS = {"a": "slow-bodies-a", "b": "slow-bodies-b", "c": "slow-bodies-c"}
BLOCK = 16 << 10  # a tenant's share: a quarter of the 64 KiB budget
TIMEOUT_S = 3.0


def _hex(i: int) -> str:
    return i.to_bytes(32, "big").hex()


def _auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[tenant]}"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    env = {"KVSTORE_REST_BODY_TIMEOUT_S": str(TIMEOUT_S)}
    proc = ServerProc(tmp_path_factory.mktemp("slow-bodies") / "data", "--tenant-tokens",
                      json.dumps(TOKENS), "--rest-body-budget-bytes", "64KiB",
                      "--log-level", "debug", env=env).start()
    for tenant in TOKENS:
        with httpx.Client(base_url=proc.url, headers=_auth(tenant), timeout=30) as api:
            r = api.post("/v1/namespaces", json={"name": f"slow-{tenant}", "block_bytes": BLOCK})
            assert r.status_code == 201, r.text
    yield proc
    proc.stop()


def _put_head(tenant: str, i: int) -> bytes:
    return (f"PUT /v1/blocks/slow-{tenant}/{_hex(i)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKENS[tenant]}\r\nContent-Length: {BLOCK}\r\n\r\n").encode()


def _reply(sock: socket.socket) -> tuple[bytes, bytes]:
    """The status line and the rest of a response (headers and body, up to the close)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
            _, sep, body = data.partition(b"\r\n\r\n")
            if sep and body.rstrip().endswith(b"}"):
                break
    status, _, rest = data.partition(b"\r\n")
    return status, rest


def _answered(sock: socket.socket) -> bool:
    """Whether the server has written anything to ``sock`` yet (without waiting)."""
    sock.setblocking(False)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


def test_a_tenant_trickling_uploads_locks_no_one_out_and_times_out(srv: ServerProc) -> None:
    with contextlib.ExitStack() as stack:
        slow = [stack.enter_context(socket.create_connection(("127.0.0.1", srv.port),
                                                             timeout=10)) for _ in range(4)]
        start = time.monotonic()
        for i, sock in enumerate(slow):  # four bodies of 16 KiB would fill the whole budget
            sock.sendall(_put_head("a", 100 + i) + b"a")
        # a JSON body trickled too (c's): FastAPI reads it, the same deadline holds
        lookup = stack.enter_context(socket.create_connection(("127.0.0.1", srv.port),
                                                              timeout=10))
        lookup.sendall(b"POST /v1/lookup HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
                       b"Bearer " + TOKENS["c"].encode() + b"\r\nContent-Type: "
                       b"application/json\r\nContent-Length: 1000\r\n\r\n{")
        time.sleep(0.5)
        # a's uploads past its share are refused at once, with a reason and a retry hint
        for sock in slow[1:]:
            status, rest = _reply(sock)
            assert status.startswith(b"HTTP/1.1 429"), (status, rest[:300])
            assert b"retry-after: 1" in rest.lower()
            assert b"rest_body_budget_per_tenant_bytes" in rest
        # while a's first upload trickles, b stores its blocks
        with httpx.Client(base_url=srv.url, headers=_auth("b"), timeout=10) as b:
            for i in range(3):
                r = b.put(f"/v1/blocks/slow-b/{_hex(i)}", content=bytes([i]) * BLOCK)
                assert r.status_code == 201, r.text
        first = slow[0]
        while not _answered(first) and time.monotonic() - start < TIMEOUT_S + 10:
            with contextlib.suppress(OSError):
                first.sendall(b"a")  # one byte every half second: never done in time
            time.sleep(0.5)
        status, rest = _reply(first)
        waited = time.monotonic() - start
        json_status, json_rest = _reply(lookup)
    assert status.startswith(b"HTTP/1.1 408"), (status, rest[:300])
    assert b"rest_body_timeout_s" in rest
    assert json_status.startswith(b"HTTP/1.1 408"), (json_status, json_rest[:300])
    assert TIMEOUT_S - 0.5 < waited < TIMEOUT_S + 5, waited
    with httpx.Client(base_url=srv.url, headers=_auth("a"), timeout=10) as a:
        r = a.put(f"/v1/blocks/slow-a/{_hex(200)}", content=b"x" * BLOCK)
        assert r.status_code == 201, r.text  # a's share came back with the 408
    assert "Traceback" not in srv.log(200_000)


def test_a_client_leaving_mid_body_is_a_debug_line(srv: ServerProc) -> None:
    for i in range(3):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
            sock.sendall(_put_head("a", 300 + i) + b"z" * 1000)
            time.sleep(0.3)  # the route is reading the body when the client goes
    deadline = time.monotonic() + 10
    while "client left during PUT" not in srv.log(200_000) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = srv.log(200_000)
    assert "client left during PUT /v1/blocks/slow-a/" in log, log[-3000:]
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]
    with httpx.Client(base_url=srv.url, headers=_auth("a"), timeout=10) as a:
        r = a.put(f"/v1/blocks/slow-a/{_hex(301)}", content=b"y" * BLOCK)
        assert r.status_code == 201, r.text  # nothing of the three left bodies is still held
