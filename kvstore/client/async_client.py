"""asyncio client of the kvstore data plane: the same methods as
:class:`kvstore.client.sync_client.KVStoreClient`, as coroutines.

Connections come from a small pool (``pool_size``), so concurrent tasks run concurrent
requests; the shared-memory path (local puts through staged places in one round trip) and the
reconnect-and-retry-once rule are the same as the sync client's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx

from kvstore.client.discovery import ServerInfo, auth_headers, check_response, info_url, parse_info
from kvstore.client.errors import (
    CapacityError,
    KVStoreClientError,
    KVStoreUnavailableError,
    ProtocolError,
    StaleStagingError,
)
from kvstore.client.plan import batches, get_batch, merge_put, slab_room
from kvstore.client.shm import SlabMapping, remap
from kvstore.client.staging import StagedPlaces
from kvstore.client.stream_conn import AsyncConn, copy_into
from kvstore.protocol.frame import Buffer

T = TypeVar("T")


class AsyncKVStoreClient:
    def __init__(self, url: str, token: str | None = None, *, use_shm: bool | None = None,
                 timeout: float = 10.0, pool_size: int = 4, transport: str = "auto",
                 owner: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.transport = transport
        self.token = token
        self.use_shm = use_shm
        self.timeout = timeout
        # pins, reservations and grants of all our connections are held under this id; a
        # client given the id of one it replaces can still release what that one held
        self.owner = owner or uuid.uuid4().hex
        self._pool_size = pool_size
        self._idle: list[AsyncConn] = []
        self._open = 0
        self._freed = asyncio.Condition()
        self._info: ServerInfo | None = None
        self._slab: SlabMapping | None = None
        self._block_bytes: dict[str, int] = {}  # per namespace, learnt from extents
        self._staged = StagedPlaces()  # shm places for one-round-trip puts
        self._closed = False

    # -- public API (see KVStoreClient for each contract) ---------------------------------
    async def register_namespace(self, name: str, block_bytes: int, layout: dict[str, Any],
                                 hash_algo: str = "sha256", hash_seed: str | None = None,
                                 tenant: str | None = None) -> dict[str, Any]:
        reply = await self._call({"op": "register", "name": name, "block_bytes": block_bytes,
                                  "layout": layout, "hash_algo": hash_algo,
                                  "hash_seed": hash_seed, "tenant": tenant})
        return {**reply["namespace"], "created": reply["created"]}

    async def put(self, namespace: str, hashes: Sequence[bytes], blocks: Sequence[Buffer], *,
                  durable: bool = False) -> dict[str, int]:
        if len(hashes) != len(blocks):
            raise ValueError(f"{len(hashes)} hashes but {len(blocks)} blocks")
        return await self._retry(lambda c: self._put(c, namespace, list(hashes), blocks,
                                                     durable))

    async def get(self, namespace: str, hashes: Sequence[bytes]) -> list[bytes | None]:
        return await self._retry(lambda c: self._get(c, namespace, list(hashes), None))

    async def get_into(self, namespace: str, hashes: Sequence[bytes],
                       buffers: Sequence[Buffer]) -> list[bool]:
        """Copy each block into the matching writable buffer; True where found."""
        found: list[bool] = await self._retry(
            lambda c: self._get(c, namespace, list(hashes), buffers))
        return found

    async def lookup(self, namespace: str, hashes: Sequence[bytes]) -> tuple[int, list[str]]:
        reply = await self._call({"op": "lookup", "ns": namespace, "hashes": list(hashes)})
        return int(reply["prefix_blocks"]), list(reply["tiers"])

    async def prefetch(self, namespace: str, hashes: Sequence[bytes], *,
                       wait: bool = True) -> None:
        await self._call({"op": "prefetch", "ns": namespace, "hashes": list(hashes)}, wait)

    async def pin(self, namespace: str, hashes: Sequence[bytes], lease_s: float | None = None,
                  *, wait: bool = True) -> list[bool]:
        reply = await self._call({"op": "pin", "ns": namespace, "hashes": list(hashes),
                                  "lease_s": lease_s}, wait)
        return [bool(x) for x in reply.get("pinned", ())]

    async def release(self, namespace: str, hashes: Sequence[bytes], *,
                      wait: bool = True) -> int:
        reply = await self._call({"op": "release", "ns": namespace, "hashes": list(hashes)},
                                 wait)
        return int(reply.get("released", 0))

    async def delete(self, namespace: str, hashes: Sequence[bytes]) -> int:
        reply = await self._call({"op": "delete", "ns": namespace, "hashes": list(hashes)})
        return int(reply["deleted"])

    async def flush(self) -> None:
        await self._call({"op": "flush"})

    async def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = (await self._call({"op": "stats"}))["stats"]
        return stats

    async def health(self) -> dict[str, Any]:
        health: dict[str, Any] = (await self._call({"op": "health"}))["health"]
        return health

    async def close(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
        if self._slab is not None:
            self._slab.close()
            self._slab = None

    async def __aenter__(self) -> AsyncKVStoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- operations -----------------------------------------------------------------------
    async def _put(self, conn: AsyncConn, ns: str, hashes: list[bytes], blocks: Sequence[Buffer],
                   durable: bool) -> dict[str, int]:
        assert self._info is not None
        results = []
        slab = self._slab
        room = slab_room(self._info) if slab is not None and not durable else None
        for lo, hi in batches([memoryview(b).nbytes for b in blocks], self._info, max_bytes=room):
            hs, bs = hashes[lo:hi], blocks[lo:hi]
            if slab is not None and not durable:
                staged = await self._put_staged(conn, slab, ns, hs, bs)
                if staged is not None:
                    results.append(staged)
                    continue
                reply = (await conn.request({"op": "shm_reserve", "ns": ns, "hashes": hs},
                                            timeout=self.timeout))[0]
                try:
                    for i, ext in enumerate(reply["extents"]):
                        if ext is not None:
                            slab.write(ext, bs[i])
                except BaseException:
                    await conn.request({"op": "shm_abort", "ns": ns, "hashes": hs},
                                       timeout=self.timeout)
                    raise
                req: dict[str, Any] = {"op": "shm_commit", "ns": ns, "hashes": hs}
            else:
                req = {"op": "put", "ns": ns, "hashes": hs, "durable": durable,
                       "sizes": [memoryview(b).nbytes for b in bs]}
            payload = () if req["op"] == "shm_commit" else bs
            results.append((await conn.request(req, payload, timeout=self.timeout))[0])
        return merge_put(results)

    async def _put_staged(self, conn: AsyncConn, slab: SlabMapping, ns: str, hs: list[bytes],
                          bs: Sequence[Buffer]) -> dict[str, int] | None:
        """One batch through staged places in one round trip (as the sync client's); None
        if the server could not stage enough places (the caller reserves and commits)."""
        instance = conn.instance
        places = self._staged.pooled(instance, ns, len(hs))
        if places is None:
            return None
        if len(places) < len(hs):
            try:
                places += (await conn.request({"op": "shm_stage", "ns": ns,
                                               "count": len(hs) - len(places)},
                                              timeout=self.timeout))[0]["staged"]
            except BaseException:
                self._staged.give_back(instance, ns, places)
                raise
        places = self._staged.enough(instance, ns, len(hs), places)
        if places is None:
            return None
        self._staged.fill(slab, instance, ns, places, bs)
        try:
            reply = (await conn.request({"op": "shm_put", "ns": ns, "hashes": hs,
                                         "places": [ext[0][0] for ext in places]},
                                        timeout=self.timeout))[0]
        except StaleStagingError:  # the server dropped them: nothing was stored
            self._staged.forget(ns)
            return None
        # on any other failure (a timeout, a cancelled task) the places are dropped (see
        # StagedPlaces.settle)
        self._staged.settle(instance, ns, places, reply)
        return reply

    async def _get(self, conn: AsyncConn, ns: str, hashes: list[bytes],
                   into: Sequence[Buffer] | None) -> list[Any]:
        """Blocks (or, with ``into``, whether each was copied into its buffer)."""
        assert self._info is not None
        out: list[Any] = []
        slab = self._slab
        lo = 0
        while lo < len(hashes):
            step = get_batch(self._info, self._block_bytes.get(ns)) if slab is not None \
                else self._info.max_batch
            hs = hashes[lo:lo + step]
            reply = None
            if slab is not None:
                try:
                    reply = (await conn.request({"op": "shm_acquire", "ns": ns, "hashes": hs},
                                                timeout=self.timeout))[0]
                except CapacityError:  # the host tier is full of pinned blocks: use the socket
                    reply = None
            if slab is None or reply is None:
                blocks = (await conn.request({"op": "get", "ns": ns, "hashes": hs},
                                             timeout=self.timeout))[1]
                out += blocks if into is None else \
                    [copy_into(b, into[lo + i]) for i, b in enumerate(blocks)]
                lo += step
                continue
            try:
                for i, ext in enumerate(reply["extents"], lo):
                    if ext is None:
                        out.append(None if into is None else False)
                        continue
                    self._block_bytes[ns] = sum(n for _, n in ext)
                    out.append(slab.read(ext) if into is None
                               else slab.read_into(ext, into[i]) > 0)
            finally:
                await conn.request({"op": "shm_release", "ns": ns, "hashes": hs,
                                    "noreply": True}, timeout=self.timeout)
            lo += step
        return out

    # -- connections ----------------------------------------------------------------------
    async def _call(self, header: dict[str, Any], wait: bool = True) -> dict[str, Any]:
        if not wait:  # no reply comes; frames on a connection run in order
            header = {**header, "noreply": True}

        async def one(conn: AsyncConn) -> dict[str, Any]:
            return (await conn.request(header, timeout=self.timeout))[0]

        return await self._retry(one)

    async def _retry(self, fn: Callable[[AsyncConn], Awaitable[T]]) -> T:
        for attempt in (0, 1):
            conn: AsyncConn | None = None
            try:
                conn = await self._acquire()
                result = await fn(conn)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError) as exc:
                if isinstance(exc, KVStoreClientError) and not isinstance(
                        exc, KVStoreUnavailableError | ProtocolError):
                    raise
                await self._discard(conn)
                if attempt:
                    raise KVStoreUnavailableError(f"kvstore at {self.url}: {exc!r}") from exc
                continue
            except BaseException:
                await self._discard(conn)
                raise
            await self._give_back(conn)
            return result
        raise AssertionError("unreachable")

    async def _acquire(self) -> AsyncConn:
        if self._closed:
            raise KVStoreClientError("client is closed")
        async with self._freed:
            while not self._idle and self._open >= self._pool_size:
                await self._freed.wait()
            if self._idle:
                return self._idle.pop()
            self._open += 1
        try:
            info = self._info or await self._discover()
            conn = await AsyncConn.open(info, self.timeout)
            hello = (await conn.request({"op": "hello", "token": self.token,
                                         "owner": self.owner}, timeout=self.timeout))[0]
            if hello.get("instance") != info.instance:
                conn.close()
                self._info = None
                raise ProtocolError("server restarted during connect")
            return conn
        except BaseException:
            async with self._freed:
                self._open -= 1
                self._freed.notify()
            raise

    async def _give_back(self, conn: AsyncConn) -> None:
        async with self._freed:
            if self._info is not None and conn.instance == self._info.instance \
                    and not self._closed:
                self._idle.append(conn)
            else:
                conn.close()
                self._open -= 1
            self._freed.notify()

    async def _discard(self, conn: AsyncConn | None) -> None:
        self._info = None  # rediscover on the next connect
        if conn is None:
            return
        conn.close()
        async with self._freed:
            self._open -= 1
            for stale in self._idle:
                stale.close()
            self._open -= len(self._idle)
            self._idle.clear()
            self._freed.notify_all()

    async def _discover(self) -> ServerInfo:
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as http:
                r = await http.get(info_url(self.url), headers=auth_headers(self.token))
        except httpx.HTTPError as exc:
            raise KVStoreUnavailableError(f"cannot reach kvstore at {self.url}: {exc}") from exc
        check_response(r.status_code, r.text, self.url)
        info = parse_info(self.url, r.json(), self.transport)
        old, self._slab = self._slab, None
        self._slab = remap(old, info, self.use_shm, self.url)
        self._info = info
        return info
