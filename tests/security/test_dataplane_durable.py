"""Every put path reads ``durable`` the same strict way. ``put``
takes a boolean; the shared-memory writes (``shm_reserve``, ``shm_stage``, ``shm_put``,
``shm_commit``) are never durable, so they refuse the field unless it is false, instead of
ignoring it (``durable: true`` there used to store the block without making it durable)."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc
from tests.security import dataplane_wire
from tests.security.dataplane_wire import call, connect, h

dp_server = dataplane_wire.dp_server  # the fixture, used by name

BLOCK = 4096
SHM_WRITES: list[dict[str, Any]] = [
    {"op": "shm_reserve", "hashes": [h(1)]},
    {"op": "shm_stage", "count": 1},
    {"op": "shm_put", "hashes": [], "places": []},
    {"op": "shm_commit", "hashes": [h(1)]},
]


@pytest.fixture
def dp_durable_server(dp_server) -> ServerProc:
    srv: ServerProc = dp_server()
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace("dp-durable", BLOCK, {})
    return srv


@pytest.mark.parametrize("value", [0, 1, None, "true"])
def test_put_takes_only_a_boolean(dp_durable_server, value) -> None:
    with connect(dp_durable_server) as s:
        r = call(s, {"op": "put", "id": 1, "ns": "dp-durable", "hashes": [h(2)],
                     "sizes": [BLOCK], "durable": value}, b"p" * BLOCK)
        assert r["ok"] is False and r["error"]["code"] == "bad_request", r


@pytest.mark.parametrize("value", [0, 1, True, "true"])
@pytest.mark.parametrize("request_", SHM_WRITES, ids=lambda r: r["op"])
def test_shared_memory_writes_refuse_durable(dp_durable_server, request_, value) -> None:
    with connect(dp_durable_server) as s:
        r = call(s, {**request_, "id": 1, "ns": "dp-durable", "durable": value})
        assert r["ok"] is False and r["error"]["code"] == "bad_request", r
        assert "durable" in r["error"]["message"]
        # false (or absent) is what these ops always meant: accepted
        r = call(s, {**request_, "id": 2, "ns": "dp-durable", "durable": False})
        assert r["ok"] is True, r
