"""Connections that never authenticate are closed after a short
``hello`` deadline and are limited apart from authenticated ones, so that they cannot take the
slots of real clients; and one tenant holds at most ``max_connections_per_tenant`` of the
established ones."""

from __future__ import annotations

import socket
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvstore.client import KVStoreClient
from tests.security import dataplane_wire
from tests.security.dataplane_wire import (
    call,
    closed_within,
    connect,
    h,
    hello,
)

dp_server = dataplane_wire.dp_server  # the fixture, used by name

TOKEN = "dp-secret"
BLOCK = 4096


def test_idle_unauthenticated_connections_do_not_starve_clients(dp_server) -> None:
    # 30 half-open connections against 20 slots: the report's 55 against 50, made smaller
    srv = dp_server("--token", TOKEN, "--max-connections", "20")
    idle = [connect(srv) for _ in range(30)]
    try:
        time.sleep(0.3)
        with KVStoreClient(srv.url, token=TOKEN, use_shm=False) as c:
            c.register_namespace("dp-conn", BLOCK, {})
            assert c.put("dp-conn", [h(1)], [b"c" * BLOCK]).stored == 1
            assert c.get("dp-conn", [h(1)]) == [b"c" * BLOCK]
        # the hello deadline (5 s by default, not the 600 s idle timeout) closes them
        start = time.monotonic()
        assert all(closed_within(s, 8 - (time.monotonic() - start)) for s in idle)
    finally:
        for s in idle:
            s.close()


def test_unauthenticated_connections_have_their_own_limit(dp_server) -> None:
    srv = dp_server("--token", TOKEN, "--max-pending-connections", "8", "--hello-timeout-s",
                    "2", "--max-connections", "2")
    idle: list[socket.socket] = []
    try:
        for _ in range(12):  # past the limit, the oldest unauthenticated ones are dropped
            idle.append(connect(srv))
            time.sleep(0.02)
        dropped = [s for s in idle[:4] if closed_within(s, 1.0)]
        assert len(dropped) == 4
        # authenticated connections have their own slots: two fit, a third is refused
        first, second = hello(srv, TOKEN), hello(srv, TOKEN)
        with connect(srv) as third:
            reply = call(third, {"op": "hello", "id": 1, "token": TOKEN})
            assert reply["ok"] is False and reply["error"]["code"] == "busy", reply
            assert closed_within(third, 2)
        assert all(closed_within(s, 4) for s in idle[4:])  # the hello deadline
        for s in (first, second):  # the authenticated ones stay
            with s:
                assert call(s, {"op": "ping", "id": 5})["ok"] is True
    finally:
        for s in idle:
            s.close()



TOKEN_A, TOKEN_B = "dp-tenant-a-0123", "dp-tenant-b-0123"


def _refused(srv, token: str) -> dict:
    with connect(srv) as s:
        reply = call(s, {"op": "hello", "id": 1, "token": token})
        assert closed_within(s, 3)
    return reply


def test_one_tenant_cannot_take_every_connection(dp_server) -> None:
    # the report: one tenant held all 1,024 data-plane connections; 12 and 4 here
    srv = dp_server("--token", TOKEN, "--tenant-tokens",
                    f'{{"a": "{TOKEN_A}", "b": "{TOKEN_B}"}}', "--max-connections", "12",
                    "--max-connections-per-tenant", "4")
    held = [hello(srv, TOKEN_A) for _ in range(4)]
    others: list[socket.socket] = []
    try:
        reply = _refused(srv, TOKEN_A)  # the fifth of tenant a: a clear error, then a close
        assert reply["ok"] is False and reply["error"]["code"] == "busy", reply
        assert "max_connections_per_tenant" in reply["error"]["message"]
        # another tenant, and the admin, still connect
        others = [hello(srv, TOKEN_B), hello(srv, TOKEN), hello(srv, TOKEN)]
        for s in others:
            assert call(s, {"op": "ping", "id": 2})["ok"] is True
        # a's slot comes back when one of its connections closes
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:
            with connect(srv) as s:
                if call(s, {"op": "hello", "id": 1, "token": TOKEN_A})["ok"]:
                    break
            assert time.monotonic() < deadline, "a closed connection's slot never came back"
            time.sleep(0.1)
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10,
                            headers={"Authorization": f"Bearer {TOKEN}"}).text
        refused = {tuple(sample.labels.items()): sample.value
                   for family in text_string_to_metric_families(metrics)
                   for sample in family.samples
                   if sample.name == "kvstore_dataplane_connections_refused_total"}
        assert refused[(("reason", "max_connections_per_tenant"),)] >= 1, refused
    finally:
        for s in held + others:
            s.close()
