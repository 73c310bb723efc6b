"""REST request bodies: no body is read before the token check,
each route's body is bounded by what the route can use, bodies in flight share one budget,
and a chunked body over its limit is a 413 with a message, not a 400."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.testing.server import ServerProc

TOKEN = "rest-bodies-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BLOCK = 4096


def _hex(i: int) -> str:
    return i.to_bytes(32, "big").hex()


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


def _status_line(sock: socket.socket) -> bytes:
    """Read until the end of the response headers; return the first line."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


@pytest.fixture(scope="module")
def rest_bodies_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("rest-bodies") / "data", "--token", TOKEN,
                      "--max-batch", "100", "--rest-body-budget-bytes", "64KiB").start()
    with httpx.Client(base_url=proc.url, headers=AUTH) as api:
        r = api.post("/v1/namespaces", json={"name": "bodies", "block_bytes": BLOCK})
        assert r.status_code == 201, r.text
        r = api.post("/v1/namespaces", json={"name": "big", "block_bytes": 48 << 10})
        assert r.status_code == 201, r.text
    yield proc
    proc.stop()
    assert "Traceback" not in proc.log(200_000)


def test_unauthenticated_60mib_body_is_refused_before_it_is_read(
        rest_bodies_server: ServerProc) -> None:
    assert rest_bodies_server.proc is not None
    pid = rest_bodies_server.proc.pid
    entry = b'"' + _hex(7).encode() + b'",'
    body = b'{"namespace": "bodies", "block_hashes": [' + entry * ((60 << 20) // len(entry))
    body = body[:-1] + b"]}"
    head = (f"POST /v1/lookup HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    before = _peak_rss_kib(pid)
    with socket.create_connection(("127.0.0.1", rest_bodies_server.port), timeout=20) as sock:
        start = time.monotonic()
        sock.sendall(head)

        def push() -> None:
            # the server closes the connection without reading the body: expected
            with contextlib.suppress(OSError):
                sock.sendall(body)

        sender = threading.Thread(target=push, daemon=True)
        sender.start()
        status = _status_line(sock)
        elapsed = time.monotonic() - start
    sender.join(timeout=20)
    assert status.startswith(b"HTTP/1.1 401"), status
    assert elapsed < 2.0, f"401 took {elapsed:.2f} s"
    time.sleep(0.5)
    grown_mib = (_peak_rss_kib(pid) - before) / 1024
    assert grown_mib < 8, f"server peak RSS grew {grown_mib:.0f} MiB for a refused body"


def test_block_put_over_the_block_size_is_413(rest_bodies_server: ServerProc) -> None:
    with httpx.Client(base_url=rest_bodies_server.url, headers=AUTH, timeout=30) as api:
        r = api.put(f"/v1/blocks/bodies/{_hex(1)}", content=b"x" * (2 * BLOCK))
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "too_large" and f"{BLOCK}-byte" in r.json()["message"]
        r = api.put(f"/v1/blocks/bodies/{_hex(1)}", content=b"x" * BLOCK)
        assert r.status_code == 201, r.text


def test_lookup_over_max_batch_bytes_is_413(rest_bodies_server: ServerProc) -> None:
    hashes = [_hex(i) for i in range(1000)]  # ~67 KB of JSON; 100 hashes fit in ~78 KiB
    body = json.dumps({"namespace": "bodies", "block_hashes": hashes * 2}).encode()
    with httpx.Client(base_url=rest_bodies_server.url, headers=AUTH, timeout=30) as api:
        r = api.post("/v1/lookup", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert "lookup" in r.json()["message"]
        ok = api.post("/v1/lookup", json={"namespace": "bodies", "block_hashes": hashes[:100]})
        assert ok.status_code == 200, ok.text


def _chunked(sock: socket.socket, head: str, total: int) -> bytes:
    """Send a chunked request of ``total`` body bytes and return the whole response. The server
    may answer and close before the body is all sent: a refused write ends the sending."""
    sock.sendall(head.encode())
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for _ in range(total // 1024):
            sock.sendall(b"400\r\n" + b" " * 1024 + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and data.rstrip().endswith(b"}"):
                break
    return data


def test_chunked_body_over_the_limit_is_413(rest_bodies_server: ServerProc) -> None:
    for path, total in (("/v1/lookup", 200 << 10), (f"/v1/blocks/bodies/{_hex(2)}", 2 * BLOCK)):
        method = "POST" if path == "/v1/lookup" else "PUT"
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                f"{TOKEN}\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n")
        with socket.create_connection(("127.0.0.1", rest_bodies_server.port), timeout=20) as s:
            reply = _chunked(s, head, total)
        status, _, rest = reply.partition(b"\r\n")
        assert status.startswith(b"HTTP/1.1 413"), reply[:300]
        body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
        assert body["error"] == "too_large", body
        assert path != "/v1/lookup" or "limit" in body["message"], body


def test_bodies_in_flight_share_one_budget(rest_bodies_server: ServerProc) -> None:
    size = 48 << 10  # the budget is 64 KiB: one such body fits, two do not
    head = (f"PUT /v1/blocks/big/{{h}} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: {size}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", rest_bodies_server.port), timeout=20) as first, \
            socket.create_connection(("127.0.0.1", rest_bodies_server.port), timeout=20) as second:
        first.sendall(head.format(h=_hex(11)).encode() + b"a" * 1024)  # body under way
        time.sleep(0.3)
        second.sendall(head.format(h=_hex(12)).encode())
        status = _status_line(second)
        assert status.startswith(b"HTTP/1.1 503"), status
        first.sendall(b"a" * (size - 1024))
        status = _status_line(first)
        assert status.startswith(b"HTTP/1.1 201"), status
    with httpx.Client(base_url=rest_bodies_server.url, headers=AUTH, timeout=30) as api:
        r = api.put(f"/v1/blocks/big/{_hex(12)}", content=b"b" * size)
        assert r.status_code == 201, r.text  # the budget was given back
