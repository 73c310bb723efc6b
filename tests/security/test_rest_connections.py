"""REST connection slots: half-open connections (headers never
finished) neither starve ``/healthz`` nor authenticated calls, and are closed after the header
deadline; past the cap on connections awaiting headers, the oldest is closed at once."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from kvstore.testing.server import ServerProc

TOKEN = "rest-conn-admin"
PARTIAL = b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: never finished


@pytest.fixture
def rest_conn_server(tmp_path: Path) -> Iterator[Callable[..., ServerProc]]:
    made: list[ServerProc] = []

    def make(*args: str) -> ServerProc:
        proc = ServerProc(tmp_path / f"data{len(made)}", "--token", TOKEN, *args)
        made.append(proc)
        return proc.start()

    yield make
    for proc in made:
        proc.stop()
        assert "Traceback" not in proc.log(200_000)


def _half_open(stack: ExitStack, port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
        sock.sendall(PARTIAL)
        socks.append(sock)
    return socks


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (a 408 before EOF is fine)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_half_open_connections_starve_nothing_and_expire(rest_conn_server) -> None:
    srv = rest_conn_server("--max-connections", "50", "--rest-header-timeout-s", "2")
    with ExitStack() as stack:
        socks = _half_open(stack, srv.port, 55)
        time.sleep(0.3)  # all 55 accepted and waiting for headers
        with httpx.Client(base_url=srv.url, timeout=5) as api:
            assert api.get("/healthz").status_code == 200
            r = api.get("/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200, r.text
        start = time.monotonic()
        assert all(_closed_within(s, 6.0) for s in socks)
        assert time.monotonic() - start < 6.0


def test_oldest_pending_connection_is_closed_past_the_cap(rest_conn_server) -> None:
    srv = rest_conn_server("--rest-max-pending-connections", "10",
                           "--rest-header-timeout-s", "30")
    with ExitStack() as stack:
        old = _half_open(stack, srv.port, 10)
        time.sleep(0.2)
        new = _half_open(stack, srv.port, 10)
        time.sleep(0.2)
        assert all(_closed_within(s, 3.0) for s in old)  # long before the 30 s deadline
        assert not any(_closed_within(s, 0.2) for s in new)
        with httpx.Client(base_url=srv.url, timeout=5) as api:
            assert api.get("/healthz").status_code == 200
