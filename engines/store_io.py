"""Block save/load between the engine's paged cache and kvstore.

The engine talks to any store through :class:`BlockStore` (five methods). Two adapters satisfy
it: :class:`LocalStore` around an in-process ``kvstore.store.Store`` and :class:`RemoteStore`
around ``kvstore.client.KVStoreClient``; :func:`open_store` picks one from an address.
:class:`KVConnector` is what the scheduler uses: it hashes nothing itself, it only finds how
much of a hash chain the store holds, copies those blocks into cache blocks, and saves new
full blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from engines.decoder import kernels
from kvstore.namespace import Layout, Namespace
from kvstore.types import BlockHash, Buffer

log = logging.getLogger(__name__)


class BlockStore(Protocol):
    """The slice of kvstore the engine needs. Hashes are raw bytes."""

    def register_namespace(self, name: str, block_bytes: int, layout: Layout,
                           hash_algo: str, hash_seed: str | None) -> None: ...

    def lookup(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """Length of the longest prefix of ``hashes`` the store holds."""
        ...

    def get(self, namespace: str, hashes: Sequence[bytes]) -> list[bytes | None]: ...

    def get_into(self, namespace: str, hashes: Sequence[bytes],
                 buffers: Sequence[memoryview]) -> list[bool]:
        """Copy each block into its writable buffer (a cache row); whether it arrived."""
        ...

    def put(self, namespace: str, hashes: Sequence[bytes], blocks: Sequence[Buffer]) -> None: ...

    def node_id(self) -> str | None:
        """The cluster node id of the kvstore server (None: in process, or a node alone)."""
        ...

    def store_name(self, namespace: str) -> str:
        """The name the store (and a cluster's block index) knows ``namespace`` by, once
        registered: ``tenant~name`` for a tenant token's."""
        ...


@dataclass(slots=True)
class ConnectorStats:
    """What a :class:`KVConnector` did: lookups made, blocks the store held, loaded into the
    cache and saved from it, and store errors (each one a miss or a dropped save)."""

    lookups: int = 0
    hit_blocks: int = 0
    loaded_blocks: int = 0
    saved_blocks: int = 0
    errors: int = 0


class LocalStore:
    """:class:`BlockStore` over an in-process ``kvstore.store.Store``."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def register_namespace(self, name: str, block_bytes: int, layout: Layout,
                           hash_algo: str, hash_seed: str | None) -> None:
        self.store.register_namespace(Namespace(
            name=name, block_bytes=block_bytes, layout=layout,
            hash_algo=hash_algo, hash_seed=hash_seed,
        ))

    def lookup(self, namespace: str, hashes: Sequence[bytes]) -> int:
        return int(self.store.lookup(namespace, list(hashes)).prefix_blocks)

    def node_id(self) -> str | None:
        return None

    def store_name(self, namespace: str) -> str:
        return namespace

    def get(self, namespace: str, hashes: Sequence[bytes]) -> list[bytes | None]:
        return list(self.store.get(namespace, list(hashes)))

    def get_into(self, namespace: str, hashes: Sequence[bytes],
                 buffers: Sequence[memoryview]) -> list[bool]:
        out = []
        for data, buf in zip(self.get(namespace, hashes), buffers, strict=True):
            if data is None or len(data) != buf.nbytes:
                out.append(False)
                continue
            buf[:] = data
            out.append(True)
        return out

    def put(self, namespace: str, hashes: Sequence[bytes], blocks: Sequence[Buffer]) -> None:
        self.store.put(namespace, list(hashes), list(blocks))

    def close(self) -> None:
        pass  # the store belongs to whoever built it


def _block_hashes(hashes: Sequence[bytes]) -> list[BlockHash]:
    """The engine's chained hashes, as the client's typed block hashes (no copy of any)."""
    return cast("list[BlockHash]", list(hashes))


class RemoteStore:
    """:class:`BlockStore` over ``kvstore.client.KVStoreClient`` (a ``kvstore serve``)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        from kvstore.client import KVStoreClient

        self.client = KVStoreClient(url, token)
        self.url = url
        self._token = token
        self._node: tuple[str | None] | None = None  # (the answer,) once the server gave it
        self._store_names: dict[str, str] = {}  # as registered: the store's name of each

    def register_namespace(self, name: str, block_bytes: int, layout: Layout,
                           hash_algo: str, hash_seed: str | None) -> None:
        registered = self.client.register_namespace(name, block_bytes, layout,
                                                    hash_algo=hash_algo, hash_seed=hash_seed)
        self._store_names[name] = registered.store_name or name

    def store_name(self, namespace: str) -> str:
        return self._store_names.get(namespace, namespace)

    def lookup(self, namespace: str, hashes: Sequence[bytes]) -> int:
        result = self.client.lookup(namespace, _block_hashes(hashes))
        return int(result[0])

    def get(self, namespace: str, hashes: Sequence[bytes]) -> list[bytes | None]:
        return list(self.client.get(namespace, _block_hashes(hashes)))

    def put(self, namespace: str, hashes: Sequence[bytes], blocks: Sequence[Buffer]) -> None:
        self.client.put(namespace, _block_hashes(hashes), list(blocks))

    def get_into(self, namespace: str, hashes: Sequence[bytes],
                 buffers: Sequence[memoryview]) -> list[bool]:
        """Copy blocks straight into writable buffers (cache rows): one copy out of the
        server's shared memory instead of two."""
        return list(self.client.get_into(namespace, _block_hashes(hashes), list(buffers)))

    def node_id(self) -> str | None:
        """From the server's ``/v1/info``, asked until it answers (then kept: a server keeps
        its node id across restarts)."""
        if self._node is None:
            import httpx

            from kvstore.client.discovery import info_url
            from kvstore.protocol.info import ServerInfo

            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            try:
                r = httpx.get(info_url(self.url), headers=headers, timeout=2.0)
                r.raise_for_status()
                self._node = (ServerInfo.model_validate_json(r.content).node_id,)
            except (httpx.HTTPError, ValueError):
                return None
        return self._node[0]

    def close(self) -> None:
        self.client.close()


def open_store(addr: str | None, token: str | None = None) -> BlockStore | None:
    """``None``/``""``: no store. ``http(s)://...`` or ``host:port``: a kvstore server, called
    with bearer ``token`` when it requires one."""
    if not addr:
        return None
    if "://" not in addr:
        addr = f"http://{addr}"
    return RemoteStore(addr, token)


class KVConnector:
    """Moves whole blocks between one engine's cache and one kvstore namespace.

    Store failures never fail a request: a lookup or load error counts as a miss (the engine
    recomputes), a save error is logged and dropped. Counters are for stats endpoints."""

    def __init__(self, store: BlockStore, cache: torch.Tensor, namespace: str,
                 layout: Layout, hash_algo: str, hash_seed: str | None) -> None:
        self.store, self.cache, self.namespace = store, cache, namespace
        self.block_bytes = cache[0].numel() * cache.element_size()
        store.register_namespace(namespace, self.block_bytes, layout, hash_algo, hash_seed)
        self.stats = ConnectorStats()

    def lookup(self, hashes: Sequence[bytes]) -> int:
        """Blocks of the prefix ``hashes`` the store can supply now."""
        if not hashes:
            return 0
        self.stats.lookups += 1
        try:
            n = self.store.lookup(self.namespace, hashes)
        except Exception:  # a store outage must degrade to recomputation
            log.exception("kvstore lookup failed")
            self.stats.errors += 1
            return 0
        self.stats.hit_blocks += n
        return n

    def load(self, hashes: Sequence[bytes], blocks: Sequence[int]) -> int:
        """Copy the stored blocks ``hashes`` into cache blocks ``blocks``; returns how many of
        the leading ones arrived (a block evicted since the lookup ends the prefix there)."""
        if not hashes:
            return 0
        if not self.cache.is_cuda:  # straight into the cache rows: one copy, not two
            try:
                found = self.store.get_into(self.namespace, hashes,
                                            kernels.row_views(self.cache, blocks))
            except Exception:
                log.exception("kvstore get_into failed")
                self.stats.errors += 1
                return 0
            n = 0
            while n < len(found) and found[n]:
                n += 1
            self.stats.loaded_blocks += n
            return n
        try:
            data = self.store.get(self.namespace, hashes)
        except Exception:
            log.exception("kvstore get failed")
            self.stats.errors += 1
            return 0
        rows: list[bytes] = []  # the leading blocks that arrived whole
        for block in data:
            if block is None or len(block) != self.block_bytes:
                break
            rows.append(block)
        if rows:
            kernels.scatter_blocks(self.cache, list(blocks[:len(rows)]), rows)
            self.stats.loaded_blocks += len(rows)
        return len(rows)

    def save(self, hashes: Sequence[bytes], blocks: Sequence[int]) -> None:
        """Store cache blocks ``blocks`` under ``hashes`` (full blocks only)."""
        # two sequences that computed the same prefix in one step name the same hash twice;
        # send it once (a store may take a batch with duplicates as a conflict)
        first = dict(zip(hashes, blocks, strict=True))
        if not first:
            return
        try:
            self.store.put(self.namespace, list(first),
                           kernels.gather_blocks(self.cache, list(first.values())))
            self.stats.saved_blocks += len(first)
        except Exception:
            log.exception("kvstore put failed")
            self.stats.errors += 1
