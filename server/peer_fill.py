"""Reads that reach the whole cluster: before a node serves a lookup, a get or a shared-memory
grant, the run of requested blocks it lacks and other nodes hold is read from them (verified
as it lands, :mod:`kvstore.cluster.peers`) and stored here under the node's own admission
rule, so that the read that follows finds it. A request whose blocks the node holds costs one
lookup of its own index and nothing else; a local miss costs one Redis round trip more, and a
peer transfer only where a peer holds the blocks.

Faults never reach the engine: a peer that fails or lies is skipped, Redis away means no
peers, a store that refuses the copies (no room) leaves a miss.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kvstore.cluster.link import RedisError
from kvstore.cluster.node import ClusterNode
from kvstore.cluster.peers import Peers, fetch_run
from kvstore.errors import KVStoreError, WouldBlock
from kvstore.namespace import Namespace
from kvstore.store import StoreAPI
from kvstore.types import BlockHash

log = logging.getLogger("kvstore.cluster")

Run = Callable[..., Awaitable[Any]]


class PeerFill:
    """Fills ``store`` from the peers ``node`` knows of."""

    def __init__(self, node: ClusterNode, store: StoreAPI, peers: Peers) -> None:
        self.node = node
        self._store = store
        self._peers = peers

    async def before_read(self, run: Run, ns: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Fill what ``hashes`` lack here, in a worker thread (``run``); at once when the node
        holds them all (its lookup, tried on the event loop first)."""
        try:
            if self._store.lookup(ns.name, hashes, nowait=True).prefix_blocks == len(hashes):
                return
        except WouldBlock:
            pass
        await run(self.fill, ns, hashes)

    def fill(self, ns: Namespace, hashes: Sequence[BlockHash]) -> int:
        """Read from peers the run of ``hashes`` after the longest prefix held here, store it
        here; how many blocks came."""
        held = self._store.lookup(ns.name, hashes).prefix_blocks
        if held == len(hashes):
            return 0
        started = time.perf_counter()
        try:
            got, blocks = fetch_run(self.node, self._peers, ns, hashes[held:])
        except RedisError as exc:
            log.debug("no peer lookup for %s: Redis does not answer (%s)", ns.name, exc)
            return 0
        if not got:
            return 0
        try:
            self._store.put(ns.name, got, blocks)
        except KVStoreError as exc:  # no room, the namespace deleted meanwhile: a miss
            log.info("%d blocks read from peers could not be kept: %s", len(got), exc)
            return 0
        self.node.count_fetched(len(got), sum(len(b) for b in blocks),
                                time.perf_counter() - started)
        return len(got)

    def close(self) -> None:
        """Leave the cluster (:meth:`ClusterNode.close`) and close the peers' clients."""
        self.node.close()
        self._peers.close()
