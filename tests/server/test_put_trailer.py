"""Socket puts whose checksums come after their blocks (``trailer``, protocol 2): stored byte
for byte whether the payload lands in the slab or in a buffer, a block whose trailer checksum
differs from its bytes is refused on both paths, and the client sends a trailer only to a
server that speaks protocol 2 (older ones get ``sums`` in the header, as before)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from kvstore.checksum import checksums
from kvstore.client import AsyncKVStoreClient, KVStoreClient
from kvstore.client.discovery import Route
from kvstore.client.summed import ALONGSIDE, frame_groups
from kvstore.client.transfer import sent_summed
from kvstore.protocol import PROTOCOL_VERSION, Limits, Put, pack_sums
from kvstore.protocol.frame import PREFIX, decode_header
from kvstore.testing.server import ServerProc

from .test_dataplane_faults import call, connect, h

BLOCK = 64 << 10


@pytest.fixture
def srv(make_server: Callable[..., ServerProc]) -> ServerProc:
    server = make_server()
    with KVStoreClient(server.url) as c:
        c.register_namespace("t", BLOCK, {})
    return server


def _put(hashes: list[bytes], durable: bool = False) -> dict[str, object]:
    return {"op": "put", "id": 1, "ns": "t", "hashes": hashes, "sizes": [BLOCK] * len(hashes),
            "durable": durable, "trailer": True}


@pytest.mark.parametrize("durable", [False, True], ids=["into_slab", "buffered"])
def test_a_trailer_put_is_stored_byte_identical(srv: ServerProc, durable: bool) -> None:
    data = [os.urandom(BLOCK) for _ in range(3)]
    keys = [h(i) for i in range(3)]
    with connect(srv) as s:
        r = call(s, _put(keys, durable), b"".join(data) + pack_sums(checksums(data)))
    assert (r["ok"], r["stored"], r["refused"]) == (True, 3, 0)
    with KVStoreClient(srv.url, use_shm=False) as c:
        assert c.get("t", keys) == data


@pytest.mark.parametrize("durable", [False, True], ids=["into_slab", "buffered"])
def test_a_block_whose_trailer_checksum_differs_is_refused(srv: ServerProc,
                                                          durable: bool) -> None:
    data = [os.urandom(BLOCK) for _ in range(3)]
    keys = [h(10 + i) for i in range(3)]
    sums = checksums(data)
    sums[1] ^= 1  # the sender's checksum of block 1 is not of the bytes that arrive
    with connect(srv) as s:
        r = call(s, _put(keys, durable), b"".join(data) + pack_sums(sums))
        assert (r["ok"], r["stored"], r["refused"]) == (True, 2, 1)
        # the same blocks with header sums (a protocol 1 client), and with none at all
        old = {**_put([h(20), h(21)]), "sums": checksums(data[:2])}
        del old["trailer"]
        assert call(s, old, data[0] + data[1])["stored"] == 2
        bare = {k: v for k, v in old.items() if k != "sums"} | {"hashes": [h(22)],
                                                                 "sizes": [BLOCK]}
        assert call(s, bare, data[2])["stored"] == 1
    with KVStoreClient(srv.url, use_shm=False) as c:
        assert c.get("t", keys) == [data[0], None, data[2]]
        assert c.get("t", [h(20), h(21), h(22)]) == data


def test_a_trailer_put_without_its_trailer_is_refused_whole(srv: ServerProc) -> None:
    data = os.urandom(BLOCK)
    with connect(srv) as s:
        r = call(s, _put([h(30)]), data)  # the payload is one block, no checksum after it
        assert r["ok"] is False and r["error"]["code"] == "bad_request"
    with KVStoreClient(srv.url, use_shm=False) as c:
        assert c.get("t", [h(30)]) == [None]


def test_the_client_puts_with_a_trailer_over_tcp(srv: ServerProc) -> None:
    data = [os.urandom(BLOCK) for _ in range(40)]  # over ALONGSIDE: hashed during the send
    keys = [h(100 + i) for i in range(40)]
    with KVStoreClient(srv.url, use_shm=False, transport="tcp") as c:
        assert c.put("t", keys, data).stored == 40
        assert c.get("t", keys) == data


def test_the_async_client_puts_with_a_trailer_over_tcp(srv: ServerProc) -> None:
    data = [os.urandom(BLOCK) for _ in range(40)]  # over ALONGSIDE: hashed after the write
    keys = [h(200 + i) for i in range(40)]

    async def main() -> None:
        async with AsyncKVStoreClient(srv.url, use_shm=False, transport="tcp") as c:
            assert (await c.put("t", keys, data)).stored == 40
            assert await c.get("t", keys) == data

    asyncio.run(main())


def _route(protocol: int) -> Route:
    return Route("i", False, ("127.0.0.1", 1), None, 0, 1 << 30, 100, protocol=protocol)


def test_only_a_protocol_2_server_is_sent_a_trailer() -> None:
    data = [os.urandom(BLOCK) for _ in range(2)]
    new = sent_summed(_route(PROTOCOL_VERSION), "t", [h(0), h(1)], [BLOCK] * 2, False, data)
    old = sent_summed(_route(1), "t", [h(0), h(1)], [BLOCK] * 2, False, data)
    assert (new.trailer, new.sums) == (True, None)
    assert (old.trailer, old.sums) == (False, checksums(data))
    assert "trailer" not in old.to_header()


@pytest.mark.parametrize("alongside", [False, True])
@pytest.mark.parametrize("count", [1, ALONGSIDE // BLOCK + 3])
def test_frame_groups_send_the_blocks_then_their_checksums(alongside: bool,
                                                           count: int) -> None:
    data = [os.urandom(BLOCK) for _ in range(count)]
    put = Put("t", [h(i) for i in range(count)], [BLOCK] * count, trailer=True)
    wire = b"".join(bytes(p) for g in frame_groups(put.to_header(), data, alongside=alongside)
                    for p in g)
    hlen, plen = PREFIX.unpack(wire[:PREFIX.size])
    got = Put.from_header(decode_header(wire[PREFIX.size:PREFIX.size + hlen]),
                          Limits(100, plen))
    payload = wire[PREFIX.size + hlen:]
    assert len(payload) == plen and payload[:count * BLOCK] == b"".join(data)
    got.read_trailer(payload[count * BLOCK:])
    assert got.sums == checksums(data)
