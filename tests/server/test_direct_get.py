"""Socket gets sent straight out of the host slab (server/dataplane/direct_get.py): the bytes
are the blocks' own, blocks held only below the host tier, misses and repeats come out as
before, the pins go once the reply is sent, and a block deleted (its slots wanted again) while
its reply is still on the way reaches the reader intact."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable

import msgpack
import pytest

from kvstore.checksum import checksum
from kvstore.client import AsyncKVStoreClient, KVStoreClient, Landed
from kvstore.protocol.frame import PREFIX
from kvstore.testing.server import ServerProc

from .test_dataplane_faults import connect, h, recv_exact, send_raw

MIB = 1 << 20


def _pinned(srv: ServerProc) -> int:
    with KVStoreClient(srv.url) as c:
        return int(c.stats().totals.pinned)


def _until_unpinned(srv: ServerProc) -> int:
    deadline = time.monotonic() + 15
    while (got := _pinned(srv)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


BLOCK = 64 << 10


def two_tiers(make_server: Callable[..., ServerProc], loop: str,
              ns: str) -> tuple[ServerProc, list[bytes]]:
    """A server on event loop ``loop`` whose namespace ``ns`` holds blocks ``h(0..7)``, the
    oldest on disk and the newest in the host tier (which has room for 4 of them)."""
    srv = make_server("--event-loop", loop, host_capacity=f"{4 * BLOCK >> 10}KiB")
    data = [os.urandom(BLOCK) for _ in range(8)]
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace(ns, BLOCK, {})
        c.put(ns, [h(i) for i in range(8)], data)
        tiers = c.lookup(ns, [h(i) for i in range(8)])[1]
    assert "disk" in tiers and "host" in tiers
    return srv, data


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_get_over_the_socket_mixes_slab_and_lower_tiers(
    make_server: Callable[..., ServerProc], loop: str,
) -> None:
    srv, data = two_tiers(make_server, loop, "dg")
    with KVStoreClient(srv.url, use_shm=False, transport="tcp") as c:
        asked = [h(7), h(0), h(99), h(7), *[h(i) for i in range(1, 7)]]
        want = [data[7], data[0], None, data[7], *data[1:7]]
        assert c.get("dg", asked) == want
        into = [bytearray(BLOCK) for _ in asked]
        assert c.get_into("dg", asked, into) == [w is not None for w in want]
        assert [bytes(b) for b, w in zip(into, want, strict=True) if w is not None] \
            == [w for w in want if w is not None]
    assert _until_unpinned(srv) == 0


@pytest.mark.parametrize("use_shm", [False, True])
def test_get_into_checked_names_the_checksum_each_block_was_checked_against(
    make_server: Callable[..., ServerProc], use_shm: bool,
) -> None:
    srv, data = two_tiers(make_server, "uvloop", "dg")
    asked = [h(7), h(99), h(0)]  # in the host tier, nowhere, on disk
    into = [bytearray(BLOCK) for _ in asked]
    transport = "unix" if use_shm else "tcp"  # the slab is shared over the Unix socket
    with KVStoreClient(srv.url, use_shm=use_shm, transport=transport) as c:
        got = c.get_into_checked("dg", asked, into)
    # from disk, a socket get sends the block checked there; a grant promotes it first
    on_disk = Landed(checksum(data[0]) if use_shm else None)
    assert got == [Landed(checksum(data[7])), None, on_disk]
    assert (bytes(into[0]), bytes(into[2])) == (data[7], data[0])

    async def checked() -> list[Landed | None]:
        async with AsyncKVStoreClient(srv.url, use_shm=use_shm, transport=transport) as c:
            return await c.get_into_checked("dg", asked[:2], into[:2])
    assert asyncio.run(checked()) == [Landed(checksum(data[7])), None]
    assert _until_unpinned(srv) == 0


def test_a_block_deleted_mid_reply_reaches_the_reader_intact(
    make_server: Callable[..., ServerProc],
) -> None:
    count = 12
    srv = make_server("--frame-timeout-s", "20", host_capacity=f"{count + 2}MiB")
    data = [os.urandom(MIB) for _ in range(count)]
    hashes = [h(i) for i in range(count)]
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace("dg", MIB, {})
        assert c.put("dg", hashes, data).stored == count
    reader = connect(srv)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    try:
        send_raw(reader, msgpack.packb({"op": "get", "id": 1, "ns": "dg", "hashes": hashes}))
        hlen, plen = PREFIX.unpack(recv_exact(reader, 8))
        assert msgpack.unpackb(recv_exact(reader, hlen))["sizes"] == [MIB] * count
        got = recv_exact(reader, MIB)  # then stop reading: the rest waits on the server
        assert _pinned(srv) > 0
        with KVStoreClient(srv.url, use_shm=False) as other:
            assert other.delete("dg", hashes) == count
            fresh = [os.urandom(MIB) for _ in range(count)]
            other.put("dg", [h(100 + i) for i in range(count)], fresh)
        got += recv_exact(reader, plen - MIB)
        assert got == b"".join(data)
    finally:
        reader.close()
    assert _until_unpinned(srv) == 0


def test_a_reader_that_never_reads_is_cut_off_and_its_pins_go(
    make_server: Callable[..., ServerProc],
) -> None:
    count = 24
    srv = make_server("--frame-timeout-s", "2", host_capacity=f"{count + 2}MiB")
    with KVStoreClient(srv.url, use_shm=False) as c:
        c.register_namespace("dg", MIB, {})
        c.put("dg", [h(i) for i in range(count)], [os.urandom(MIB) for _ in range(count)])
    reader = connect(srv)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    try:
        send_raw(reader, msgpack.packb({"op": "get", "id": 1, "ns": "dg",
                                        "hashes": [h(i) for i in range(count)]}))
        time.sleep(0.5)
        assert _pinned(srv) > 0
        assert _until_unpinned(srv) == 0  # the frame timeout aborts the connection
    finally:
        reader.close()
