"""Every data-plane op as a typed message: encode then decode gives the same message, a
malformed header gives the FrameError the server answers with, and headers keep the bytes
the clients sent before the messages existed."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from kvstore.namespace import Layout, Namespace
from kvstore.protocol import (
    REQUESTS,
    AbortReply,
    Ack,
    Check,
    Delete,
    DeleteNamespace,
    DeleteNamespaceReply,
    DeleteReply,
    ExtentsReply,
    FrameError,
    Get,
    GetReply,
    HealthReply,
    Hello,
    HelloReply,
    Limits,
    Lookup,
    LookupReply,
    NamespacesReply,
    Pin,
    PinReply,
    Prefetch,
    PrefetchReply,
    Put,
    PutReply,
    Register,
    RegisterReply,
    Release,
    ReleaseReply,
    Reply,
    Request,
    ShmAbort,
    ShmAcquire,
    ShmCheck,
    ShmCommit,
    ShmLookup,
    ShmLookupReply,
    ShmPut,
    ShmPutReply,
    ShmRelease,
    ShmReserve,
    ShmStage,
    StageReply,
    StatsReply,
    decode_request,
)
from kvstore.protocol.frame import decode_header, pack_header
from kvstore.protocol.health import StoreHealth, TierHealth
from kvstore.protocol.info import ServerInfo
from kvstore.protocol.session import Flush, Health, Namespaces, Ping, Stats
from kvstore.protocol.shm import ShmMap, ShmMapReply
from kvstore.protocol.stats import StoreStats, TierStats, TotalStats
from kvstore.types import BlockHash

H = [BlockHash(b"a" * 32), BlockHash(b"b" * 8)]
NS = Namespace("n", 4096, Layout(model_id="m", block_size=16), tenant="t")
INFO = ServerInfo(version="1", protocol=1, instance="abc", host_id="h", data_port=None,
                  unix_socket="/s", shm=None, auth_required=False, max_frame_bytes=1 << 20,
                  max_header_bytes=1 << 16, max_batch=8)
LIMITS = Limits(max_batch=10, payload_len=7)

SAMPLES: list[Request] = [
    Hello("secret", "client-1"), Hello(), Ping(),
    Register("llama", 4096, Layout(model_id="m", extra={"k": [1]}), "xxh3_64", "seed", "t1"),
    Register("n", 1),
    Namespaces(), Put("ns", H, [3, 4], durable=True), Put("ns", H, [5, 2]),
    Put("ns", H, [5, 2], trailer=True), Get("ns", H),
    Get("ns", H, checked=True), Check("ns", H),
    Lookup("ns", H), Prefetch("ns", H), Pin("ns", H, 2.5), Pin("ns", H), Release("ns", H),
    Delete("ns", H), Stats(), Health(), Flush(),
    ShmReserve("ns", H, 1.0), ShmReserve("ns", H), ShmCommit("ns", H), ShmAbort("ns", H),
    ShmAcquire("ns", H, 3.0), ShmRelease("ns", H, grant=True), ShmRelease("ns", H),
    ShmStage("ns", 10), ShmPut("ns", H, [0, 4096]), ShmLookup("ns", H, 6.0), ShmLookup("ns", []),
    DeleteNamespace("ns"),
    ShmMap(), ShmCheck("ns", H), ShmCommit("ns", H, [3, None]), ShmPut("ns", H, [0, 4096], [1, 2]),
]

REPLIES: list[Reply] = [
    HelloReply(INFO, "*/o"), Ack(),
    RegisterReply(True, NS), NamespacesReply([NS, Namespace("m", 2, hash_seed="s")]),
    NamespacesReply([]),
    PutReply(1, 2, 3), GetReply([4, -1]), LookupReply(2, ["host", "disk"]),
    PrefetchReply(2), PinReply([True, False]), ReleaseReply(1), DeleteReply(2),
    StatsReply(StoreStats(totals=TotalStats(hits=1))),
    StatsReply(StoreStats(totals=TotalStats(pinned=2), tiers={"host": TierStats(blocks=3)})),
    HealthReply(StoreHealth(ok=True)),
    HealthReply(StoreHealth(ok=False, error="e", tiers={"disk": TierHealth(ok=False)})),
    ExtentsReply([[[0, 4]], None]), AbortReply(1), StageReply([[[0, 4]], [[8, 4]]]),
    ShmPutReply(1, 1, 0, [0], [[[16, 4]]]), ShmLookupReply(1, ["host"], [[[0, 4]]]),
    DeleteNamespaceReply(3),
    ExtentsReply([[[0, 4]], None], [7, None]), StageReply([[[0, 4]]], [2]),
    ShmPutReply(1, 1, 0, [0], [[[16, 4]]], [5]), ShmLookupReply(1, ["host"], [[[0, 4]]], [9]),
    ShmMapReply(4096, 1024, 4096),
]


def wire(header: dict[str, Any]) -> dict[str, Any]:
    """The header as the other end reads it (through msgpack)."""
    return decode_header(pack_header(header))


def test_every_op_has_a_sample() -> None:
    assert {type(m).op for m in SAMPLES} == set(REQUESTS)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_request_round_trip(msg: Request) -> None:
    header = wire(msg.to_header())
    assert header["op"] == type(msg).op
    limits = LIMITS._replace(payload_len=sum(getattr(msg, "sizes", ()))
                             + getattr(msg, "trailer_bytes", 0))
    assert decode_request(header, limits) == msg


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_reply_round_trip(reply: Reply) -> None:
    assert type(reply).from_header(wire(reply.to_header())) == reply


def test_hello_reply_carries_the_server_info() -> None:
    header = {"id": 1, "ok": True, **INFO.model_dump(), "owner": "*/x"}
    reply = HelloReply.from_header(header)
    assert (reply.instance, reply.owner, reply.info) == ("abc", "*/x", INFO)
    assert HelloReply(INFO, "o").to_header() == {**INFO.model_dump(), "owner": "o"}


def test_stats_and_health_replies_keep_their_documents() -> None:
    """The header holds the same document as ``/v1/stats`` and ``/healthz``: a view's absent
    fields are left out, not null."""
    stats = StoreStats(totals=TotalStats(hits=1))
    assert StatsReply(stats).to_header() == {"stats": stats.doc()}
    assert "pinned" not in wire(StatsReply(stats).to_header())["stats"]["totals"]
    assert wire(HealthReply(StoreHealth(ok=True)).to_header()) == {
        "health": {"ok": True, "tiers": {}}}


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"op": "nope"}, "unknown_op", "unknown op 'nope'; known: " + ", ".join(REQUESTS)),
    ({"op": 5}, "unknown_op", "unknown op 5; known: "),
    ({}, "unknown_op", "unknown op None; known: "),
    ({"op": "hello", "token": 5}, "bad_request", "field 'token' must be a string"),
    ({"op": "hello", "owner": ""}, "bad_request", "field 'owner' must be a non-empty string"),
    ({"op": "hello", "owner": "o" * 129}, "bad_request",
     "field 'owner' is longer than 128 characters"),
    ({"op": "register", "name": "n", "block_bytes": 1, "layout": [1]}, "bad_request",
     "field 'layout' must be a map"),
    ({"op": "register", "name": "n", "block_bytes": 1, "layout": {"m": 1}}, "invalid_request",
     "Layout.__init__() got an unexpected keyword argument 'm'"),
    ({"op": "register", "name": "n", "block_bytes": 1, "layout": {"head_dim": -1}},
     "invalid_request", "layout.head_dim must be an integer"),
    ({"op": "register", "block_bytes": 1}, "bad_request",
     "field 'name' must be a non-empty string"),
    ({"op": "register", "name": "n", "block_bytes": True}, "bad_request",
     "field 'block_bytes' must be an integer"),
    ({"op": "get", "ns": 5, "hashes": H}, "bad_request",
     "field 'ns' must be a non-empty string"),
    ({"op": "get", "ns": "n", "hashes": "abc"}, "bad_request",
     "field 'hashes' must be a list of binary hashes"),
    ({"op": "lookup", "ns": "n", "hashes": ["text"]}, "bad_request",
     "each of 'hashes' must be 1-64 bytes of binary"),
    ({"op": "delete", "ns": "n", "hashes": [b"x" * 65]}, "bad_request",
     "each of 'hashes' must be 1-64 bytes of binary"),
    ({"op": "prefetch", "ns": "n", "hashes": [b"x"] * 11}, "too_large",
     "11 hashes exceed the batch limit 10"),
    ({"op": "pin", "ns": "n", "hashes": H, "lease_s": "long"}, "bad_request",
     "field 'lease_s' must be a finite, positive number of seconds"),
    ({"op": "pin", "ns": "n", "hashes": H, "lease_s": 0}, "bad_request",
     "field 'lease_s' must be a finite, positive number of seconds"),
    ({"op": "pin", "ns": "n", "hashes": H, "lease_s": -1.0}, "bad_request",
     "field 'lease_s' must be a finite, positive number of seconds"),
    ({"op": "pin", "ns": "n", "hashes": H, "lease_s": float("nan")}, "bad_request",
     "field 'lease_s' must be a finite, positive number of seconds"),
    ({"op": "shm_lookup", "ns": "n", "hashes": H, "lease_s": float("inf")}, "bad_request",
     "field 'lease_s' must be a finite, positive number of seconds"),
    ({"op": "put", "ns": "n", "hashes": H, "sizes": [3, 3]}, "bad_request",
     "'sizes' add up to 6 but the payload has 7 bytes"),
    ({"op": "put", "ns": "n", "hashes": H, "sizes": [7]}, "bad_request",
     "field 'sizes' must list 2 block sizes"),
    ({"op": "put", "ns": "n", "hashes": H, "sizes": [3, 4], "durable": 1}, "bad_request",
     "field 'durable' must be a boolean"),
    ({"op": "put", "ns": "n", "hashes": H, "sizes": [3, 4], "trailer": True, "sums": [1, 2]},
     "bad_request", "a put sends its 'sums' in the header or in a trailer, not both"),
    ({"op": "put", "ns": "n", "hashes": H, "sizes": [3, 4], "trailer": True}, "bad_request",
     "a put with a trailer ends with 16 bytes of checksums; its payload has 7"),
    ({"op": "shm_reserve", "ns": "n", "hashes": H, "lease_s": True}, "bad_request",
     "field 'lease_s' must be a finite, positive number of seconds"),
    ({"op": "shm_lookup", "ns": "n", "hashes": "nope"}, "bad_request",
     "field 'hashes' must be a list of binary hashes"),
    ({"op": "shm_release", "ns": "n", "hashes": H, "grant": "yes"}, "bad_request",
     "field 'grant' must be a boolean"),
    ({"op": "shm_stage", "ns": "n", "count": -1}, "bad_request", "'count' must be 0-10"),
    ({"op": "shm_stage", "ns": "n", "count": 11}, "bad_request", "'count' must be 0-10"),
    ({"op": "shm_stage", "ns": "n", "count": "many"}, "bad_request",
     "field 'count' must be an integer"),
    ({"op": "shm_put", "ns": "n", "hashes": H, "places": [0]}, "bad_request",
     "field 'places' must list 2 non-negative integers"),
    ({"op": "shm_put", "ns": "n", "hashes": H, "places": [-1, 2]}, "bad_request",
     "field 'places' must list 2 non-negative integers"),
    ({"op": "shm_commit", "hashes": H}, "bad_request", "field 'ns' must be a non-empty string"),
]


@pytest.mark.parametrize(("header", "code", "message"), BAD, ids=lambda v: str(v)[:40])
def test_malformed_headers_give_the_servers_frame_error(header: dict[str, Any], code: str,
                                                        message: str) -> None:
    with pytest.raises(FrameError) as err:
        decode_request(header, LIMITS)
    assert err.value.code == code and not err.value.fatal
    assert err.value.message.startswith(message)


def test_ops_say_how_dispatch_treats_them() -> None:
    assert [op for op, kind in REQUESTS.items() if kind.before_hello] == ["hello"]
    assert [op for op, kind in REQUESTS.items() if kind.takes_payload] == ["put"]
    assert {op for op, kind in REQUESTS.items() if kind.needs_shm} == \
        {op for op in REQUESTS if op.startswith("shm_")}


@pytest.mark.parametrize(("msg", "before"), [
    (Hello("t", "o"), {"op": "hello", "token": "t", "owner": "o"}),
    (Register("n", 8, Layout(model_id="m")), {
        "op": "register", "name": "n", "block_bytes": 8,
        "layout": {"model_id": "m", "num_layers": 0, "num_kv_heads": 0, "head_dim": 0,
                   "block_size": 0, "dtype": "", "layout_name": "", "extra": {}},
        "hash_algo": "sha256", "hash_seed": None, "tenant": None}),
    (Put("n", H, [3, 4]), {"op": "put", "ns": "n", "hashes": H, "sizes": [3, 4],
                           "durable": False}),
    (Pin("n", H, None), {"op": "pin", "ns": "n", "hashes": H, "lease_s": None}),
    (ShmStage("n", 3), {"op": "shm_stage", "ns": "n", "count": 3}),
    (ShmPut("n", H, [0, 8]), {"op": "shm_put", "ns": "n", "hashes": H, "places": [0, 8]}),
    (ShmRelease("n", H, grant=True), {"op": "shm_release", "ns": "n", "hashes": H,
                                      "grant": True}),
    (Lookup("n", H), {"op": "lookup", "ns": "n", "hashes": H}),
])
def test_headers_keep_the_bytes_clients_sent_before(msg: Request, before: dict) -> None:
    assert pack_header(msg.to_header()) == msgpack.packb(before, use_bin_type=True)
