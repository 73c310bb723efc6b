"""Data plane fuzzing: hypothesis-generated frames (well-framed headers of every op with wild
arguments, and raw garbage). Each gets a well-formed reply or a clean close, and the server
stays up for everyone else."""

from __future__ import annotations

import socket

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore.client import KVStoreClient
from kvstore.protocol.frame import PREFIX
from kvstore.testing.server import ServerProc

OPS = ["hello", "ping", "register", "namespaces", "put", "get", "lookup", "prefetch", "pin",
       "release", "delete", "stats", "health", "flush", "shm_reserve", "shm_commit",
       "shm_abort", "shm_acquire", "shm_release", "bogus", ""]

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=True) | st.text(max_size=16) | st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=8)
hashes = st.lists(st.binary(min_size=0, max_size=70), max_size=6) | values
headers = st.fixed_dictionaries(
    {"op": st.sampled_from(OPS) | values},
    optional={"id": values, "ns": st.sampled_from(["fz", "nope"]) | values, "hashes": hashes,
              "sizes": st.lists(st.integers(-2, 40), max_size=6) | values,
              "lease_s": values, "durable": values, "noreply": st.booleans() | values,
              "token": values, "owner": values, "name": st.text(max_size=10) | values,
              "block_bytes": st.integers(-1, 64) | values, "layout": values,
              "hash_algo": values, "hash_seed": values},
)


def exchange(server: ServerProc, frame: bytes, expect_reply: bool) -> None:
    with socket.create_connection(("127.0.0.1", server.data_port), timeout=20) as s:
        s.sendall(frame)
        if not expect_reply:
            return  # truncated or garbage: the server must cope with us just leaving
        head = b""
        while len(head) < 8:
            chunk = s.recv(8 - len(head))
            if not chunk:
                return  # a clean close is an allowed answer
            head += chunk
        hlen, plen = PREFIX.unpack(head)
        body = b""
        while len(body) < hlen + plen:
            chunk = s.recv(hlen + plen - len(body))
            assert chunk, "reply cut short"
            body += chunk
        reply = msgpack.unpackb(body[:hlen])
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
        if not reply["ok"]:
            assert isinstance(reply["error"]["code"], str) and reply["error"]["message"]


@pytest.fixture(scope="module")
def fz(server: ServerProc) -> ServerProc:
    with KVStoreClient(server.url) as c:
        c.register_namespace("fz", 16, {})
    return server


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(header=headers, payload=st.binary(max_size=96))
def test_generated_frames(fz: ServerProc, header: dict, payload: bytes) -> None:
    raw = msgpack.packb(header)
    noreply = header.get("noreply") is True
    exchange(fz, PREFIX.pack(len(raw), len(payload)) + raw + payload, expect_reply=not noreply)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(garbage=st.binary(min_size=1, max_size=64))
def test_garbage_bytes(fz: ServerProc, garbage: bytes) -> None:
    exchange(fz, garbage, expect_reply=False)


def test_still_serving_after_fuzzing(fz: ServerProc) -> None:
    with KVStoreClient(fz.url) as c:
        assert c.put("fz", [b"k" * 32], [b"v" * 16]).stored in (0, 1)
        assert c.get("fz", [b"k" * 32]) == [b"v" * 16]
    assert "Traceback" not in fz.log()
