"""Python client of the kvstore data plane, the asyncio face: the methods of
:class:`~kvstore.client.sync_client.KVStoreClient` as coroutines, over the same core
(:mod:`kvstore.client.core`); this module only does the asyncio I/O.

Connections come from a small pool (``pool_size``), so concurrent tasks run concurrent
requests; the shared-memory path (local puts through staged places in one round trip) and the
reconnect-and-retry-once rule are the sync client's, since they live in the core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from kvstore.client import calls
from kvstore.client.core import ClientCore
from kvstore.client.discovery import Route
from kvstore.client.errors import KVStoreClientError, ProtocolError
from kvstore.client.exchange import Exchange, Steps
from kvstore.client.landed import Landed
from kvstore.client.stream_conn import AsyncConn
from kvstore.client.transfer import check_put
from kvstore.namespace import Layout, Registered
from kvstore.protocol import Buffer
from kvstore.protocol.health import StoreHealth
from kvstore.protocol.stats import StoreStats
from kvstore.types import BlockHash, PutResult

T = TypeVar("T")


class AsyncKVStoreClient:
    def __init__(self, url: str, token: str | None = None, *, use_shm: bool | None = None,
                 timeout: float = 10.0, pool_size: int = 4, transport: str = "auto",
                 owner: str | None = None) -> None:
        self._core = ClientCore(url, token, use_shm=use_shm, timeout=timeout,
                                transport=transport, owner=owner)
        self._pool_size = pool_size
        self._idle: list[AsyncConn] = []
        self._open = 0
        self._freed = asyncio.Condition()
        self._closed = False

    # -- public API (see KVStoreClient for each contract) ---------------------------------
    async def register_namespace(self, name: str, block_bytes: int,
                                 layout: Layout | Mapping[str, Any],
                                 hash_algo: str = "sha256", hash_seed: str | None = None,
                                 tenant: str | None = None) -> Registered:
        return await self._run(calls.register, name, block_bytes, layout, hash_algo,
                               hash_seed, tenant)

    async def delete_namespace(self, name: str) -> int:
        return await self._run(calls.delete_namespace, name)

    async def put(self, namespace: str, hashes: Sequence[BlockHash], blocks: Sequence[Buffer],
                  *, durable: bool = False) -> PutResult:
        """Store blocks; how many were stored, already there, or refused."""
        check_put(hashes, blocks)
        return await self._run(self._core.transfers.put, namespace, hashes, blocks, durable)

    async def get(self, namespace: str, hashes: Sequence[BlockHash]) -> list[bytes | None]:
        return await self._run(self._core.transfers.get, namespace, hashes, None)

    async def get_into(self, namespace: str, hashes: Sequence[BlockHash],
                       buffers: Sequence[Buffer]) -> list[bool]:
        return await self._run(self._core.transfers.get, namespace, hashes, buffers)

    async def get_into_checked(self, namespace: str, hashes: Sequence[BlockHash],
                               buffers: Sequence[Buffer]) -> list[Landed | None]:
        return await self._run(self._core.transfers.get, namespace, hashes, buffers, True)

    async def lookup(self, namespace: str,
                     hashes: Sequence[BlockHash]) -> tuple[int, list[str]]:
        return await self._run(calls.lookup, namespace, hashes)

    async def prefetch(self, namespace: str, hashes: Sequence[BlockHash], *,
                       wait: bool = True) -> None:
        await self._run(calls.prefetch, namespace, hashes, wait)

    async def pin(self, namespace: str, hashes: Sequence[BlockHash],
                  lease_s: float | None = None, *, wait: bool = True) -> list[bool]:
        return await self._run(calls.pin, namespace, hashes, lease_s, wait)

    async def release(self, namespace: str, hashes: Sequence[BlockHash], *,
                      wait: bool = True) -> int:
        return await self._run(calls.release, namespace, hashes, wait)

    async def delete(self, namespace: str, hashes: Sequence[BlockHash]) -> int:
        return await self._run(calls.delete, namespace, hashes)

    async def flush(self) -> None:
        await self._run(calls.flush)

    async def stats(self) -> StoreStats:
        """The server's counters as this token may see them (``GET /v1/stats``)."""
        return await self._run(calls.stats)

    async def health(self) -> StoreHealth:
        return await self._run(calls.health)

    async def close(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
        self._core.close()

    async def __aenter__(self) -> AsyncKVStoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- running a call -------------------------------------------------------------------
    async def _run(self, steps: Callable[..., Steps[T]], *args: Any) -> T:
        """Run one call's steps on a pooled connection, reconnecting and running them once
        more if the connection broke (the core says which errors mean that)."""
        for attempt in (0, 1):
            conn: AsyncConn | None = None
            try:
                conn = await self._acquire()
                result = await self._drive(conn, steps(self._core.link(conn.info), *args))
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError) as exc:
                if not self._core.retryable(exc):
                    raise
                await self._discard(conn)
                if attempt:
                    raise self._core.unavailable(exc) from exc
                continue
            except BaseException:
                await self._discard(conn)
                raise
            await self._give_back(conn)
            return result
        raise AssertionError("unreachable")

    async def _drive(self, conn: AsyncConn, steps: Steps[T]) -> T:
        exchange = Exchange(steps)
        while exchange.call is not None:
            try:
                answer = await conn.call(exchange.call, self._core.timeout)
            except BaseException as exc:  # the steps may clean up (a cancelled put aborts)
                exchange.fail(exc)
            else:
                exchange.answer(answer)
        return exchange.result

    # -- the pool -------------------------------------------------------------------------
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
            info = self._core.info or await self._discover()
            conn = await AsyncConn.open(info, self._core.timeout)
            if not await self._drive(conn, self._core.hello(info)):
                conn.close()
                self._core.info = None
                raise ProtocolError("server restarted during connect")
            return conn
        except BaseException:
            async with self._freed:
                self._open -= 1
                self._freed.notify()
            raise

    async def _give_back(self, conn: AsyncConn) -> None:
        async with self._freed:
            info = self._core.info
            if info is not None and conn.instance == info.instance and not self._closed:
                self._idle.append(conn)
            else:
                conn.close()
                self._open -= 1
            self._freed.notify()

    async def _discard(self, conn: AsyncConn | None) -> None:
        self._core.info = None  # rediscover on the next connect
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

    async def _discover(self) -> Route:
        try:
            async with httpx.AsyncClient(timeout=self._core.timeout) as http:
                r = await http.get(self._core.info_url, headers=self._core.info_headers)
        except httpx.HTTPError as exc:
            raise self._core.cannot_reach(exc) from exc
        return self._core.adopt(r.status_code, r.text, r.json)
