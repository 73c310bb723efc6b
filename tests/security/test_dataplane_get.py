"""A data-plane ``get`` reply never exceeds the frame limit (a clear error
instead), a block named many times in one request is read once, and the official client still
gets everything it asks for."""

from __future__ import annotations

from kvstore.client import KVStoreClient
from tests.security import dataplane_wire
from tests.security.dataplane_wire import (
    MiB,
    call,
    connect,
    h,
    request_head,
    rss_bytes,
)

dp_server = dataplane_wire.dp_server  # the fixture, used by name

NS = "dp-get"


def test_get_of_one_block_many_times_is_refused_within_the_frame_limit(dp_server) -> None:
    srv = dp_server("--max-frame-bytes", "8MiB")
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace(NS, MiB, {})
        c.put(NS, [h(1)], [b"k" * MiB])
    before = rss_bytes(srv)
    with connect(srv) as s:  # auth is off: no hello needed
        reply, plen = request_head(s, {"op": "get", "id": 1, "ns": NS, "hashes": [h(1)] * 100})
        assert plen <= 8 * MiB, f"a reply of {plen} bytes over an 8 MiB frame limit"
        assert reply["ok"] is False and reply["error"]["code"] == "too_large", reply
        assert str(8 * MiB) in reply["error"]["message"]
        # the connection goes on, and a get that fits is answered, repeats included
        ok = call(s, {"op": "get", "id": 2, "ns": NS, "hashes": [h(1)] * 3 + [h(2)]})
        assert ok["ok"] is True and ok["sizes"] == [MiB, MiB, MiB, -1]
    grown = rss_bytes(srv) - before
    assert grown < 48 * MiB, f"server RSS grew {grown / MiB:.0f} MiB for a refused get"


def test_official_client_gets_repeats_and_more_than_a_frame(dp_server) -> None:
    srv = dp_server("--max-frame-bytes", "4MiB")
    blocks = [bytes([i]) * MiB for i in range(10)]
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace(NS, MiB, {})
        assert c.put(NS, [h(i) for i in range(10)], blocks).stored == 10
        assert c.get(NS, [h(3), h(3), h(99), h(3)]) == [blocks[3], blocks[3], None, blocks[3]]
        # ten 1 MiB blocks do not fit one 4 MiB frame: the client splits its gets
        assert c.get(NS, [h(i) for i in range(10)]) == blocks
