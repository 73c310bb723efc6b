"""Python client of the kvstore data plane, the blocking face (:class:`AsyncKVStoreClient`
is the asyncio one; both run the same core, :mod:`kvstore.client.core`).

``KVStoreClient(url)`` takes the REST base URL, discovers the data plane from ``/v1/info`` on
first use and, when the server is on this host, talks over its Unix socket and moves block
bytes through the host tier's shared memory (one memcpy; only control frames cross the
socket). ``use_shm=False`` forces bytes over the socket; ``use_shm=True`` fails if the slab
cannot be mapped.

Thread-safe: each thread gets its own connection. After a server restart the next call
reconnects (and remaps the new slab) and retries once; if the server stays away, calls raise
:class:`KVStoreUnavailableError`, a ``ConnectionError``, so that callers can fall back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from kvstore.client import calls, grant
from kvstore.client.core import ClientCore
from kvstore.client.discovery import Route
from kvstore.client.errors import KVStoreClientError, ProtocolError
from kvstore.client.exchange import Link, Steps, run_blocking
from kvstore.client.grant import Grant
from kvstore.client.landed import Landed
from kvstore.client.shm import SlabMapping
from kvstore.client.socket_conn import FrameSocket
from kvstore.client.transfer import check_put
from kvstore.namespace import Layout, Registered
from kvstore.protocol import Buffer
from kvstore.protocol.health import StoreHealth
from kvstore.protocol.stats import StoreStats
from kvstore.types import BlockHash, PutResult

T = TypeVar("T")


class KVStoreClient:
    def __init__(self, url: str, token: str | None = None, *, use_shm: bool | None = None,
                 timeout: float = 10.0, transport: str = "auto",
                 owner: str | None = None) -> None:
        self._core = ClientCore(url, token, use_shm=use_shm, timeout=timeout,
                                transport=transport, owner=owner)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._conns: list[FrameSocket] = []
        self._closed = False

    # -- public API -----------------------------------------------------------------------
    def register_namespace(self, name: str, block_bytes: int,
                           layout: Layout | Mapping[str, Any],
                           hash_algo: str = "sha256", hash_seed: str | None = None,
                           tenant: str | None = None) -> Registered:
        """Register (or confirm) a namespace. Returns its definition and whether this call
        created it.
        Raises :class:`NamespaceConflictError` if it exists with another definition."""
        return self._run(calls.register, name, block_bytes, layout, hash_algo, hash_seed,
                         tenant)

    def delete_namespace(self, name: str) -> int:
        """Forget namespace ``name`` and remove its blocks from every tier; how many blocks it
        held. Raises :class:`UnknownNamespaceError` if this token has no namespace so named
        (another tenant's is unknown to it)."""
        return self._run(calls.delete_namespace, name)

    def put(self, namespace: str, hashes: Sequence[BlockHash], blocks: Sequence[Buffer], *,
            durable: bool = False) -> PutResult:
        """Store blocks; how many were stored, already there, or refused (a
        :class:`~kvstore.types.PutResult`). With ``durable`` the reply
        comes only once the blocks are on disk (they then survive ``kill -9``)."""
        check_put(hashes, blocks)
        return self._run(self._core.transfers.put, namespace, hashes, blocks, durable)

    def get(self, namespace: str, hashes: Sequence[BlockHash]) -> list[bytes | None]:
        """Each block's bytes, or None for a miss."""
        return self._run(self._core.transfers.get, namespace, hashes, None)

    def get_into(self, namespace: str, hashes: Sequence[BlockHash],
                 buffers: Sequence[Buffer]) -> list[bool]:
        """Copy each block into the matching writable buffer; True where found."""
        return self._run(self._core.transfers.get, namespace, hashes, buffers)

    def get_into_checked(self, namespace: str, hashes: Sequence[BlockHash],
                         buffers: Sequence[Buffer]) -> list[Landed | None]:
        """:meth:`get_into`, saying for each block copied the checksum its bytes were checked
        against as they landed (a receiver that keeps the blocks need not hash them again);
        None for a miss."""
        return self._run(self._core.transfers.get, namespace, hashes, buffers, True)

    def lookup(self, namespace: str, hashes: Sequence[BlockHash]) -> tuple[int, list[str]]:
        """``(prefix_blocks, tiers)``: the longest cached prefix and each block's tier."""
        return self._run(calls.lookup, namespace, hashes)

    def prefetch(self, namespace: str, hashes: Sequence[BlockHash], *, wait: bool = True) -> None:
        """Ask the server to onboard the blocks toward RAM (it does so in the background).
        With ``wait=False`` the request is sent without waiting for the server's answer (no
        round trip; errors are not reported)."""
        self._run(calls.prefetch, namespace, hashes, wait)

    def pin(self, namespace: str, hashes: Sequence[BlockHash], lease_s: float | None = None,
            *, wait: bool = True) -> list[bool]:
        """Pin blocks for ``lease_s`` seconds (server default if None); True where pinned.
        With ``wait=False``, sent without waiting for the answer; returns ``[]``."""
        return self._run(calls.pin, namespace, hashes, lease_s, wait)

    def release(self, namespace: str, hashes: Sequence[BlockHash], *, wait: bool = True) -> int:
        """Drop this client's pins on the blocks; how many it held (0 with ``wait=False``,
        which does not wait for the answer)."""
        return self._run(calls.release, namespace, hashes, wait)

    def delete(self, namespace: str, hashes: Sequence[BlockHash]) -> int:
        return self._run(calls.delete, namespace, hashes)

    def flush(self) -> None:
        """Make every block stored so far durable on the server's persistent tiers."""
        self._run(calls.flush)

    def stats(self) -> StoreStats:
        """The server's counters as this token may see them (``GET /v1/stats``)."""
        return self._run(calls.stats)

    def health(self) -> StoreHealth:
        """Whether the server's store can serve, and its tiers' health as this token may see
        it (``/healthz`` with the token)."""
        return self._run(calls.health)

    # -- granted reads (see kvstore.client.grant) -----------------------------------------
    def lookup_acquire(self, namespace: str, hashes: Sequence[BlockHash],
                       lease_s: float | None = None) -> Grant:
        """Look up ``hashes`` and pin, for ``lease_s`` seconds (server default if None), each
        block of the hit that the host tier holds; nothing is promoted. Without shared memory
        this is a plain lookup and no extents come back."""
        return self._run(grant.lookup_acquire, namespace, hashes, lease_s)

    def release_grant(self, namespace: str, hashes: Sequence[BlockHash], *,
                      wait: bool = True) -> int:
        """Drop the pins of a :class:`Grant` on ``hashes``; how many were held (0 with
        ``wait=False``, which does not wait for the answer). Grant pins outlive this client's
        last connection by the server's ``grant_grace_s`` (another process may be copying
        them): release them, or they stay until their lease runs out or that grace ends."""
        return self._run(grant.release_grant, namespace, hashes, wait)

    def mapped_slab(self, instance: str) -> SlabMapping | None:
        """This client's mapping of the slab of server ``instance``, or None when it is
        connected elsewhere, has no shared memory or cannot connect. The mapping stays valid
        until the client is closed or reconnects."""
        try:
            _, link = self._session()
        except (OSError, KVStoreClientError):
            return None
        return link.slab if instance and link.info.instance == instance else None

    def lease_s(self, asked: float) -> float:
        """How long a pin asked for ``asked`` seconds holds: cut to the server's
        ``max_lease_s`` once the client has discovered the server."""
        info = self._core.info
        cap = info.max_lease_s if info is not None else None
        return asked if cap is None else min(asked, cap)

    @property
    def shm_active(self) -> bool:
        """Whether block bytes move through shared memory (known after the first call)."""
        return self._core.slab is not None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._core.close()

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections ----------------------------------------------------------------------
    def _run(self, steps: Callable[..., Steps[T]], *args: Any) -> T:
        """Run one call's steps on this thread's connection; on a broken connection reconnect
        (rediscovering the server) and run them once more. Server-side errors are raised as
        they are."""
        for attempt in (0, 1):
            try:
                conn, link = self._session()
                return run_blocking(steps(link, *args), conn.call)
            except (OSError, ProtocolError) as exc:
                if not self._core.retryable(exc):
                    raise
                self._drop_connection()
                if attempt:
                    raise self._core.unavailable(exc) from exc
        raise AssertionError("unreachable")

    def _session(self) -> tuple[FrameSocket, Link]:
        if self._closed:
            raise KVStoreClientError("client is closed")
        conn: FrameSocket | None = getattr(self._local, "conn", None)
        info = self._core.info
        if conn is not None and info is not None \
                and getattr(self._local, "instance", None) == info.instance:
            return conn, self._core.link(info)
        if conn is not None:  # from before a restart or a failure in another thread
            self._forget(conn)
        info = info or self._discover()
        conn = self._connect(info)
        if conn is None:  # restarted since we asked: start over
            self._core.info = None
            info = self._discover()
            conn = self._connect(info, check=False)
        assert conn is not None
        with self._lock:
            self._conns.append(conn)
        self._local.conn, self._local.instance = conn, info.instance
        return conn, self._core.link(info)

    def _connect(self, info: Route, check: bool = True) -> FrameSocket | None:
        """A connection that said hello to server ``info``; None if another instance
        answered (with ``check``)."""
        conn = FrameSocket.connect(info.target, self._core.timeout)
        try:
            same = run_blocking(self._core.hello(info), conn.call)
        except BaseException:
            conn.close()
            raise
        if check and not same:
            conn.close()
            return None
        return conn

    def _discover(self) -> Route:
        try:
            r = httpx.get(self._core.info_url, headers=self._core.info_headers,
                          timeout=self._core.timeout)
        except httpx.HTTPError as exc:
            raise self._core.cannot_reach(exc) from exc
        return self._core.adopt(r.status_code, r.text, r.json)

    def _drop_connection(self) -> None:
        conn: FrameSocket | None = getattr(self._local, "conn", None)
        self._local.conn = None
        self._core.info = None  # rediscover: ports, socket or slab may have changed
        if conn is not None:
            self._forget(conn)

    def _forget(self, conn: FrameSocket) -> None:
        conn.close()
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
