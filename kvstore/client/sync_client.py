"""Python client of the kvstore data plane (sync; :class:`AsyncKVStoreClient` for asyncio).

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
import uuid
from collections.abc import Callable, Sequence
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
from kvstore.client.grant import GrantedReads
from kvstore.client.plan import batches, get_batch, merge_put, slab_room
from kvstore.client.shm import SlabMapping, remap
from kvstore.client.socket_conn import FrameSocket
from kvstore.client.staging import StagedPlaces
from kvstore.protocol.frame import Buffer

T = TypeVar("T")



class KVStoreClient(GrantedReads):
    def __init__(self, url: str, token: str | None = None, *, use_shm: bool | None = None,
                 timeout: float = 10.0, transport: str = "auto",
                 owner: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.transport = transport
        self.token = token
        self.use_shm = use_shm
        self.timeout = timeout
        # pins, reservations and grants of all our connections are held under this id; a
        # client given the id of one it replaces can still release what that one held
        self.owner = owner or uuid.uuid4().hex
        self._lock = threading.Lock()
        self._local = threading.local()
        self._conns: list[FrameSocket] = []
        self._info: ServerInfo | None = None
        self._slab: SlabMapping | None = None
        self._block_bytes: dict[str, int] = {}  # per namespace, learnt from extents
        self._staged = StagedPlaces()  # shm places for one-round-trip puts
        self._closed = False

    # -- public API -----------------------------------------------------------------------
    def register_namespace(self, name: str, block_bytes: int, layout: dict[str, Any],
                           hash_algo: str = "sha256", hash_seed: str | None = None,
                           tenant: str | None = None) -> dict[str, Any]:
        """Register (or confirm) a namespace. Returns its definition plus ``created``.
        Raises :class:`NamespaceConflictError` if it exists with another definition."""
        reply = self._call({"op": "register", "name": name, "block_bytes": block_bytes,
                            "layout": layout, "hash_algo": hash_algo, "hash_seed": hash_seed,
                            "tenant": tenant})
        return {**reply["namespace"], "created": reply["created"]}

    def put(self, namespace: str, hashes: Sequence[bytes], blocks: Sequence[Buffer], *,
            durable: bool = False) -> dict[str, int]:
        """Store blocks; ``{"stored", "existing", "refused"}``. With ``durable`` the reply
        comes only once the blocks are on disk (they then survive ``kill -9``)."""
        if len(hashes) != len(blocks):
            raise ValueError(f"{len(hashes)} hashes but {len(blocks)} blocks")
        return self._retry(lambda: self._put(namespace, list(hashes), blocks, durable))

    def get(self, namespace: str, hashes: Sequence[bytes]) -> list[bytes | None]:
        """Each block's bytes, or None for a miss."""
        return self._retry(lambda: self._get(namespace, list(hashes), None))

    def get_into(self, namespace: str, hashes: Sequence[bytes],
                 buffers: Sequence[Buffer]) -> list[bool]:
        """Copy each block into the matching writable buffer; True where found."""
        return self._retry(lambda: self._get(namespace, list(hashes), buffers))

    def lookup(self, namespace: str, hashes: Sequence[bytes]) -> tuple[int, list[str]]:
        """``(prefix_blocks, tiers)``: the longest cached prefix and each block's tier."""
        reply = self._call({"op": "lookup", "ns": namespace, "hashes": list(hashes)})
        return int(reply["prefix_blocks"]), list(reply["tiers"])

    def prefetch(self, namespace: str, hashes: Sequence[bytes], *, wait: bool = True) -> None:
        """Ask the server to onboard the blocks toward RAM (it does so in the background).
        With ``wait=False`` the request is sent without waiting for the server's answer (no
        round trip; errors are not reported)."""
        self._call({"op": "prefetch", "ns": namespace, "hashes": list(hashes)}, wait)

    def pin(self, namespace: str, hashes: Sequence[bytes], lease_s: float | None = None, *,
            wait: bool = True) -> list[bool]:
        """Pin blocks for ``lease_s`` seconds (server default if None); True where pinned.
        With ``wait=False``, sent without waiting for the answer; returns ``[]``."""
        reply = self._call({"op": "pin", "ns": namespace, "hashes": list(hashes),
                            "lease_s": lease_s}, wait)
        return [bool(x) for x in reply.get("pinned", ())]

    def release(self, namespace: str, hashes: Sequence[bytes], *, wait: bool = True) -> int:
        """Drop this client's pins on the blocks; how many it held (0 with ``wait=False``,
        which does not wait for the answer)."""
        return int(self._call({"op": "release", "ns": namespace, "hashes": list(hashes)},
                              wait).get("released", 0))

    def delete(self, namespace: str, hashes: Sequence[bytes]) -> int:
        return int(self._call({"op": "delete", "ns": namespace,
                               "hashes": list(hashes)})["deleted"])

    def flush(self) -> None:
        """Make every block stored so far durable on the server's persistent tiers."""
        self._call({"op": "flush"})

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._call({"op": "stats"})["stats"]
        return stats

    def health(self) -> dict[str, Any]:
        health: dict[str, Any] = self._call({"op": "health"})["health"]
        return health

    @property
    def shm_active(self) -> bool:
        """Whether block bytes move through shared memory (known after the first call)."""
        return self._slab is not None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for conn in self._conns:
                conn.close()
            self._conns.clear()
            if self._slab is not None:
                self._slab.close()
                self._slab = None

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations -----------------------------------------------------------------------
    def _put(self, ns: str, hashes: list[bytes], blocks: Sequence[Buffer],
             durable: bool) -> dict[str, int]:
        conn, info, slab = self._session()
        use_slab = slab is not None and not durable
        sizes = [memoryview(b).nbytes for b in blocks]
        results = []
        for lo, hi in batches(sizes, info, max_bytes=slab_room(info) if use_slab else None):
            hs, bs = hashes[lo:hi], blocks[lo:hi]
            if slab is not None and use_slab:
                staged = self._put_staged(conn, info, slab, ns, hs, bs)
                if staged is not None:
                    results.append(staged)
                    continue
                extents = conn.request({"op": "shm_reserve", "ns": ns, "hashes": hs})[0]
                todo = [i for i, e in enumerate(extents["extents"]) if e is not None]
                try:
                    for i in todo:
                        slab.write(extents["extents"][i], bs[i])
                except BaseException:
                    conn.request({"op": "shm_abort", "ns": ns, "hashes": hs})
                    raise
                results.append(conn.request({"op": "shm_commit", "ns": ns, "hashes": hs})[0])
            else:
                results.append(conn.request({"op": "put", "ns": ns, "hashes": hs,
                                             "sizes": sizes[lo:hi], "durable": durable}, bs)[0])
        return merge_put(results)

    def _put_staged(self, conn: FrameSocket, info: ServerInfo, slab: SlabMapping, ns: str,
                    hs: list[bytes], bs: Sequence[Buffer]) -> dict[str, int] | None:
        """One batch through staged places in one round trip (kvstore.store_stage); None if
        the server could not stage enough places (the caller reserves and commits)."""
        places = self._staged.take(info.instance, ns, len(hs), lambda count: conn.request(
            {"op": "shm_stage", "ns": ns, "count": count})[0]["staged"])
        if places is None:
            return None
        self._staged.fill(slab, info.instance, ns, places, bs)
        try:
            reply = conn.request({"op": "shm_put", "ns": ns, "hashes": hs,
                                  "places": [ext[0][0] for ext in places]})[0]
        except StaleStagingError:  # the server dropped them: nothing was stored
            self._staged.forget(ns)
            return None
        # on any other failure the places are dropped (see StagedPlaces.settle)
        self._staged.settle(info.instance, ns, places, reply)
        return reply

    def _get(self, ns: str, hashes: list[bytes], into: Sequence[Buffer] | None) -> list[Any]:
        conn, info, slab = self._session()
        if slab is None:
            return self._get_socket(conn, info, ns, hashes, into)
        out: list[Any] = [None if into is None else False] * len(hashes)
        lo = 0
        while lo < len(hashes):  # batches the host tier can hold pinned at once
            hi = min(len(hashes), lo + get_batch(info, self._block_bytes.get(ns)))
            hs = hashes[lo:hi]
            try:
                extents = conn.request({"op": "shm_acquire", "ns": ns, "hashes": hs})[0]["extents"]
            except CapacityError:  # the host tier is full of pinned blocks: use the socket
                part = self._get_socket(conn, info, ns, hs, None if into is None else into[lo:hi])
                out[lo:hi] = part
                lo = hi
                continue
            try:
                for i, ext in enumerate(extents, lo):
                    if ext is None:
                        continue
                    self._block_bytes[ns] = sum(n for _, n in ext)
                    if into is None:
                        out[i] = slab.read(ext)
                    else:
                        out[i] = slab.read_into(ext, into[i]) > 0
            finally:  # no reply needed: the pins go with the lease if this frame is lost
                conn.request({"op": "shm_release", "ns": ns, "hashes": hs, "noreply": True})
            lo = hi
        return out

    def _get_socket(self, conn: FrameSocket, info: ServerInfo, ns: str, hashes: list[bytes],
                    into: Sequence[Buffer] | None) -> list[Any]:
        out: list[Any] = []
        for lo, hi in batches(None, info, count=len(hashes)):
            out += conn.request({"op": "get", "ns": ns, "hashes": hashes[lo:hi]},
                                into=None if into is None else into[lo:hi])[1]
        return out

    # -- connections ----------------------------------------------------------------------
    def _call(self, header: dict[str, Any], wait: bool = True) -> dict[str, Any]:
        if not wait:  # the server sends no reply; frames on a connection run in order
            header = {**header, "noreply": True}
        return self._retry(lambda: self._session()[0].request(header)[0])

    def _retry(self, fn: Callable[[], T]) -> T:
        """Run ``fn``; on a broken connection reconnect (rediscovering the server) and run it
        once more. Server-side errors are raised as they are."""
        for attempt in (0, 1):
            try:
                return fn()
            except (OSError, ProtocolError) as exc:
                if isinstance(exc, KVStoreClientError) and not isinstance(
                        exc, KVStoreUnavailableError | ProtocolError):
                    raise
                self._drop_connection()
                if attempt:
                    raise KVStoreUnavailableError(f"kvstore at {self.url}: {exc}") from exc
        raise AssertionError("unreachable")

    def _session(self) -> tuple[FrameSocket, ServerInfo, SlabMapping | None]:
        if self._closed:
            raise KVStoreClientError("client is closed")
        conn: FrameSocket | None = getattr(self._local, "conn", None)
        if conn is not None and self._info is not None \
                and getattr(self._local, "instance", None) == self._info.instance:
            return conn, self._info, self._slab
        if conn is not None:  # from before a restart or a failure in another thread
            self._forget(conn)
        info = self._info or self._discover()
        conn = FrameSocket.connect(info.target, self.timeout)
        try:
            hello = conn.request({"op": "hello", "token": self.token, "owner": self.owner})[0]
        except BaseException:
            conn.close()
            raise
        if hello.get("instance") != info.instance:  # restarted since we asked: start over
            conn.close()
            self._info = None
            info = self._discover()
            conn = FrameSocket.connect(info.target, self.timeout)
            conn.request({"op": "hello", "token": self.token, "owner": self.owner})
        with self._lock:
            self._conns.append(conn)
        self._local.conn, self._local.instance = conn, info.instance
        return conn, info, self._slab

    def _discover(self) -> ServerInfo:
        try:
            r = httpx.get(info_url(self.url), headers=auth_headers(self.token),
                          timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise KVStoreUnavailableError(f"cannot reach kvstore at {self.url}: {exc}") from exc
        check_response(r.status_code, r.text, self.url)
        info = parse_info(self.url, r.json(), self.transport)
        with self._lock:
            old, self._slab = self._slab, None
            self._slab = remap(old, info, self.use_shm, self.url)
            self._info = info
        return info

    def _drop_connection(self) -> None:
        conn: FrameSocket | None = getattr(self._local, "conn", None)
        self._local.conn = None
        self._info = None  # rediscover: ports, socket or slab may have changed
        if conn is not None:
            self._forget(conn)

    def _forget(self, conn: FrameSocket) -> None:
        conn.close()
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)

