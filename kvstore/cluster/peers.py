"""Reading blocks from the other nodes that hold them.

One client per peer, over its TCP data plane with the cluster token (a node whose token does
not match is refused by the peer, as any client would be). Every block is checked against its
checksum as it lands (the client's checked get): a damaged or missing block ends the run there
or is taken from another holder, never served. A peer that fails (dies mid-transfer, times
out, holds the namespace with another definition) is skipped for the rest of the call, and by
every call for :data:`PEER_COOLDOWN_S` after, and another copy is tried; what no peer gives is
a miss. Nothing here raises to the caller.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from kvstore.client import KVStoreClient, Landed
from kvstore.client.errors import KVStoreClientError
from kvstore.cluster.node import ClusterNode, Source
from kvstore.errors import KVStoreError
from kvstore.namespace import Namespace
from kvstore.protocol import Buffer
from kvstore.protocol.cluster import PEER_OWNER, NodeView
from kvstore.types import BlockHash

log = logging.getLogger("kvstore.cluster")

PEER_TIMEOUT_S = 5.0  # seconds one peer call may take before the peer counts as failed
# seconds a failed peer is not read from: a peer cut off (not refusing) would otherwise cost
# every read the whole timeout until the roster says it is suspect
PEER_COOLDOWN_S = 10.0
_FAILED = (KVStoreClientError, KVStoreError, OSError)


class Peers:
    """Clients to the other nodes, made on first use, dropped when a call to one fails."""

    def __init__(self, token: str | None, timeout_s: float = PEER_TIMEOUT_S,
                 cooldown_s: float = PEER_COOLDOWN_S) -> None:
        self._token = token
        self._timeout_s = timeout_s
        self._cooldown_s = cooldown_s
        self._failed: dict[tuple[str, str], float] = {}  # -> when it may be read again
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], KVStoreClient] = {}
        self._registered: set[tuple[str, str, str]] = set()  # (node, url, namespace)

    def _client(self, node: NodeView) -> KVStoreClient:
        key = (node.node_id, node.rest_url)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                # a peer serves this read from what it holds, never from its own peers
                client = KVStoreClient(node.rest_url, self._token, use_shm=False,
                                       transport="tcp", timeout=self._timeout_s,
                                       owner=f"{PEER_OWNER}-{uuid.uuid4().hex}")
                self._clients[key] = client
            return client

    def read(self, node: NodeView, ns: Namespace, hashes: Sequence[BlockHash]
             ) -> list[bytes | None]:
        """Blocks of ``ns`` from ``node`` (None for each it lacks or that fails its checksum).
        The namespace is registered there first, once: a peer holding it with another
        definition refuses (``NamespaceConflictError``), and is not read."""
        return self._registered_client(node, ns).get(ns.name, hashes)

    def read_into(self, node: NodeView, ns: Namespace, hashes: Sequence[BlockHash],
                  buffers: Sequence[Buffer]) -> list[Landed | None]:
        """:meth:`read`, each block copied into its buffer and checked as it lands: its
        :class:`~kvstore.client.Landed` (the checksum it matched), None where it is missing or
        failed the check."""
        return self._registered_client(node, ns).get_into_checked(ns.name, hashes, buffers)

    def _registered_client(self, node: NodeView, ns: Namespace) -> KVStoreClient:
        """The client to ``node``, with ``ns`` registered there (once)."""
        client = self._client(node)
        mark = (node.node_id, node.rest_url, ns.name)
        if mark not in self._registered:
            client.register_namespace(ns.local_name, ns.block_bytes, ns.layout, ns.hash_algo,
                                      ns.hash_seed, tenant=ns.tenant)
            with self._lock:
                self._registered.add(mark)
        return client

    def usable(self, node: NodeView) -> bool:
        """Whether ``node`` may be read from: not failed within the cooldown."""
        key = (node.node_id, node.rest_url)
        with self._lock:
            until = self._failed.get(key)
            if until is None:
                return True
            if time.monotonic() < until:
                return False
            del self._failed[key]
            return True

    def forget(self, node: NodeView) -> None:
        """``node`` failed: drop its client, and read nothing from it for the cooldown."""
        key = (node.node_id, node.rest_url)
        with self._lock:
            self._failed[key] = time.monotonic() + self._cooldown_s
            client = self._clients.pop(key, None)
            self._registered = {m for m in self._registered if m[:2] != key}
        if client is not None:
            client.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


Receive = Callable[[NodeView, Sequence[BlockHash]], "list[bool] | None"]


def fetch_run(node: ClusterNode, peers: Peers, ns: Namespace, hashes: Sequence[BlockHash],
              receive: Receive) -> int:
    """How many leading ``hashes`` other nodes gave: each stretch is read (``receive``: from
    a node, whether each block landed and was kept; None when this node can keep no more)
    from one node that holds all of it (the best tier first), a block a node turns out not to
    hold taken from another, and that node's stale record removed. The first block is asked
    of the index alone first: a chain that no other node holds (a new prompt's suffix, the
    common miss) costs one small Redis read, not one per block."""
    if not hashes:
        return 0
    sources = node.holders(ns.name, hashes[:1])
    if not sources[0]:
        return 0
    if len(hashes) > 1:
        sources += node.holders(ns.name, hashes[1:])
    sources = [[s for s in at if peers.usable(s.node)] for at in sources]
    i = 0
    while i < len(hashes) and sources[i]:
        src = sources[i][0].node
        j = i + 1
        while j < len(hashes) and any(s.node.slot == src.slot for s in sources[j]):
            j += 1
        try:
            landed = receive(src, hashes[i:j])
        except _FAILED as exc:
            log.warning("peer %s failed reading %d blocks of %s (%s); trying other copies",
                        src.node_id, j - i, ns.name, exc)
            peers.forget(src)
            _drop(sources, src.slot, range(len(sources)))
            continue
        if landed is None:
            break
        k = next((n for n, ok in enumerate(landed) if not ok), len(landed))
        if k < len(landed):
            node.correct(src, ns.name, [hashes[i + n] for n, ok in enumerate(landed) if not ok])
            _drop(sources, src.slot, range(i + k, j))
        i += k
    return i


def _drop(sources: list[list[Source]], slot: int, at: range) -> None:
    for i in at:
        sources[i] = [s for s in sources[i] if s.node.slot != slot]
