"""Local puts through staged shared-memory places: one round trip per batch, and a clean
fallback when the server no longer holds a client's places."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections.abc import Callable

import httpx
import pytest

from kvstore.client import AsyncKVStoreClient, KVStoreClient, StaleStagingError
from kvstore.client.socket_conn import FrameSocket
from kvstore.testing.server import ServerProc
from kvstore.types import PutResult

BLOCK = 64 << 10


def _op_count(srv: ServerProc, op: str) -> int:
    text = httpx.get(srv.url + "/metrics").text
    m = re.search(rf'kvstore_request_duration_seconds_count{{op="{op}",plane="data"}} (\S+)', text)
    return int(float(m.group(1))) if m else 0


def _blocks(n: int, salt: str) -> tuple[list[bytes], list[bytes]]:
    hashes = [hashlib.sha256(f"{salt}/{i}".encode()).digest() for i in range(n)]
    return hashes, [os.urandom(BLOCK) for _ in range(n)]


def test_repeated_puts_use_staged_places(server: ServerProc, ns_name: str) -> None:
    with KVStoreClient(server.url, use_shm=True) as c:
        c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        puts, reserves = _op_count(server, "shm_put"), _op_count(server, "shm_reserve")
        for round_ in range(4):
            hashes, data = _blocks(8, f"{ns_name}/{round_}")
            assert c.put(ns_name, hashes, data) == PutResult(8, 0, 0)
            assert c.get(ns_name, hashes) == data
        hashes, data = _blocks(8, f"{ns_name}/3")
        assert c.put(ns_name, hashes, data).existing == 8  # the places stay ours
        assert _op_count(server, "shm_put") - puts == 5
        assert _op_count(server, "shm_reserve") == reserves  # no two-round-trip puts
        assert c.stats().namespaces[ns_name].blocks == 32


def test_places_dropped_by_the_server_fall_back_to_reserving(
    make_server: Callable[..., ServerProc], ns_name: str
) -> None:
    server = make_server()
    with KVStoreClient(server.url, use_shm=True) as c, KVStoreClient(server.url) as watcher:
        c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        c.put(ns_name, *_blocks(4, f"{ns_name}/a"))
        assert c._core.transfers.staged.held(ns_name)  # places held for the next put
        c._drop_connection()  # our only connection: the server drops our leases and places
        for _ in range(100):  # the server notices the close asynchronously
            if watcher.stats().tiers["host"].bytes == 4 * BLOCK:  # our places are gone
                break
            time.sleep(0.05)
        else:
            pytest.fail("the server kept the places of a client whose connections all closed")
        reserves = _op_count(server, "shm_reserve")
        hashes, data = _blocks(4, f"{ns_name}/b")
        assert c.put(ns_name, hashes, data).stored == 4  # stale places: reserved instead
        assert _op_count(server, "shm_reserve") == reserves + 1
        assert c.get(ns_name, hashes) == data
        assert c.put(ns_name, *_blocks(4, f"{ns_name}/c")).stored == 4  # staged again
    assert c._core.transfers.staged.held(ns_name)


def test_bad_staged_put_frames_get_error_frames(server: ServerProc, ns_name: str) -> None:
    with KVStoreClient(server.url, use_shm=True) as c:
        c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        info = c._session()[1].info
    conn = FrameSocket.connect(info.target, 5)
    try:
        conn.request({"op": "hello", "owner": "stager"})
        hashes, _ = _blocks(2, ns_name)
        bad = [{"op": "shm_put", "ns": ns_name, "hashes": hashes, "places": [0]},
               {"op": "shm_put", "ns": ns_name, "hashes": hashes, "places": ["a", 1]},
               {"op": "shm_put", "ns": ns_name, "hashes": hashes, "places": [-1, 2]},
               {"op": "shm_stage", "ns": ns_name, "count": -1},
               {"op": "shm_stage", "ns": ns_name, "count": "many"}]
        for frame in bad:
            with pytest.raises(ValueError, match="bad_request"):
                conn.request(frame)
        staged = conn.request({"op": "shm_stage", "ns": ns_name, "count": 2})[0]["staged"]
        assert len(staged) == 2
        with pytest.raises(StaleStagingError):  # not places this owner holds
            conn.request({"op": "shm_put", "ns": ns_name, "hashes": hashes,
                          "places": [staged[0][0][0] + 1, staged[1][0][0]]})
        assert conn.request({"op": "lookup", "ns": ns_name, "hashes": hashes})[0][
            "prefix_blocks"] == 0
        reply = conn.request({"op": "shm_put", "ns": ns_name, "hashes": hashes,
                              "places": [ext[0][0] for ext in staged]})[0]
        assert reply["stored"] == 2 and len(reply["staged"]) == 2
    finally:
        conn.close()


def test_async_client_puts_through_staged_places(server: ServerProc, ns_name: str) -> None:
    async def main() -> None:
        async with AsyncKVStoreClient(server.url, use_shm=True) as c, \
                AsyncKVStoreClient(server.url, use_shm=True) as other:
            await c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
            puts, reserves = _op_count(server, "shm_put"), _op_count(server, "shm_reserve")
            for round_ in range(3):
                hashes, data = _blocks(8, f"{ns_name}/{round_}")
                assert await c.put(ns_name, hashes, data) == \
                    PutResult(8, 0, 0)
                assert await c.get(ns_name, hashes) == data
            # concurrent puts take disjoint places (the pool holds 8; two more are staged)
            batches = [_blocks(4, f"{ns_name}/c{i}") for i in range(4)]
            results = await asyncio.gather(*(c.put(ns_name, hs, ds) for hs, ds in batches))
            assert [r.stored for r in results] == [4] * 4
            for hs, ds in batches:
                assert await c.get(ns_name, hs) == ds
            assert _op_count(server, "shm_put") - puts == 7
            assert _op_count(server, "shm_reserve") == reserves  # no two-round-trip puts

            # places the server did not stage for this client: refused, then reserved
            await other.put(ns_name, *_blocks(4, f"{ns_name}/other"))
            instance = c._core.info.instance if c._core.info else ""
            theirs = other._core.transfers.staged.pooled(instance, ns_name, 4)
            assert theirs is not None and len(theirs) == 4
            c._core.transfers.staged.forget(ns_name)
            c._core.transfers.staged.give_back(instance, ns_name, theirs)
            hashes, data = _blocks(4, f"{ns_name}/stale")
            assert (await c.put(ns_name, hashes, data)).stored == 4
            assert _op_count(server, "shm_reserve") == reserves + 1
            assert await c.get(ns_name, hashes) == data
            # dropped; the next put stages afresh
            assert c._core.transfers.staged.held(ns_name) == 0
            assert (await c.put(ns_name, *_blocks(4, f"{ns_name}/again"))).stored == 4
            assert _op_count(server, "shm_reserve") == reserves + 1

    asyncio.run(main())


def test_places_of_a_put_whose_reply_was_lost_are_never_written_again(
    server: ServerProc, ns_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server may have published the places as blocks before the reply was lost: a client
    # that put them back in its pool would write the next blocks over stored ones.
    with KVStoreClient(server.url, use_shm=True) as c:
        c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
        c.put(ns_name, *_blocks(4, f"{ns_name}/warm"))  # four places now wait in the pool
        real = FrameSocket.request

        def lose_reply(self: FrameSocket, header: dict, *args: object, **kw: object) -> object:
            reply = real(self, header, *args, **kw)  # type: ignore[arg-type]
            if header.get("op") == "shm_put":
                raise RuntimeError("reply lost")
            return reply

        hashes, data = _blocks(4, f"{ns_name}/a")
        monkeypatch.setattr(FrameSocket, "request", lose_reply)
        with pytest.raises(RuntimeError, match="reply lost"):
            c.put(ns_name, hashes, data)
        monkeypatch.setattr(FrameSocket, "request", real)
        more, more_data = _blocks(4, f"{ns_name}/b")
        assert c.put(ns_name, more, more_data).stored == 4
        assert c.get(ns_name, hashes) == data  # stored by the lost put, and intact
        assert c.get(ns_name, more) == more_data


def test_async_places_of_a_cancelled_put_are_never_written_again(
    server: ServerProc, ns_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstore.client.stream_conn import AsyncConn

    async def main() -> None:
        async with AsyncKVStoreClient(server.url, use_shm=True) as c:
            await c.register_namespace(ns_name, BLOCK, {"model_id": "m"})
            await c.put(ns_name, *_blocks(4, f"{ns_name}/warm"))
            real = AsyncConn.request

            async def cancelled(self: AsyncConn, header: dict, *args: object,
                                **kw: object) -> object:
                reply = await real(self, header, *args, **kw)  # type: ignore[arg-type]
                if header.get("op") == "shm_put":
                    raise asyncio.CancelledError
                return reply

            hashes, data = _blocks(4, f"{ns_name}/a")
            monkeypatch.setattr(AsyncConn, "request", cancelled)
            with pytest.raises(asyncio.CancelledError):
                await c.put(ns_name, hashes, data)
            monkeypatch.setattr(AsyncConn, "request", real)
            more, more_data = _blocks(4, f"{ns_name}/b")
            assert (await c.put(ns_name, more, more_data)).stored == 4
            assert await c.get(ns_name, hashes) == data
            assert await c.get(ns_name, more) == more_data

    asyncio.run(main())
