"""Reads that reach the whole cluster: before a node serves a lookup, a get or a shared-memory
grant, the run of requested blocks it lacks and other nodes hold is read from them and kept
here under the node's own admission rule, so that the read that follows finds it. A request
whose blocks the node holds costs one lookup of its own index and nothing else; a local miss
costs one Redis round trip more (none while Redis is away), and a peer transfer only where a
peer holds the blocks.

A peer's blocks land straight in host-slab places reserved for them (the socket put's
*receiving* reservation: invisible to readers, never given to another block while bytes may
still arrive), each checked against the checksum the peer recorded as it lands
(:meth:`~kvstore.client.KVStoreClient.get_into_checked`); the commit records that checksum
instead of hashing the blocks again, and every reservation ends in a commit or an abort. A
block that cannot land in one piece lands in a buffer and is copied to its places; a store
without a host slab keeps the peer's bytes with a plain put.

Faults never reach the engine: a peer that fails or lies is skipped, Redis away means no
peers, a store that refuses the copies (no room, the namespace deleted meanwhile) leaves a
miss.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, cast

from kvstore.cluster.link import RedisError
from kvstore.cluster.node import ClusterNode
from kvstore.cluster.peers import PEER_TIMEOUT_S, Peers, fetch_run
from kvstore.errors import KVStoreError, WouldBlock
from kvstore.namespace import Namespace
from kvstore.protocol import Buffer
from kvstore.protocol.cluster import NodeView
from kvstore.store import StoreAPI
from kvstore.tiers.host import HostTier
from kvstore.types import BlockHash

log = logging.getLogger("kvstore.cluster")

Run = Callable[..., Awaitable[Any]]

# A fill's own owner id: no session's owner starts with NUL, so no client can commit or abort
# a fill's reservation (as with the socket put's).
FILL_OWNER = "\x00peer-fill/"
# the reservation outlives the peer's calls (they time out after PEER_TIMEOUT_S); being
# receiving, it is only doomed, never freed, should it run out first
FILL_LEASE_S = 2 * PEER_TIMEOUT_S + 5.0
_ids = itertools.count()


class PeerFill:
    """Fills ``store`` from the peers ``node`` knows of."""

    def __init__(self, node: ClusterNode, store: StoreAPI, peers: Peers) -> None:
        self.node = node
        self._store = store
        self._peers = peers

    async def before_read(self, run: Run, ns: Namespace, hashes: Sequence[BlockHash]) -> None:
        """Fill what ``hashes`` lack here, in a worker thread (``run``); at once when the node
        holds them all (its lookup, tried on the event loop first) or Redis is away."""
        if not self.node.connected:
            return
        try:
            held: int | None = self._store.lookup(ns.name, hashes, nowait=True).prefix_blocks
        except WouldBlock:
            held = None
        if held != len(hashes):
            await run(self.fill, ns, hashes, held)

    def fill(self, ns: Namespace, hashes: Sequence[BlockHash], held: int | None = None) -> int:
        """Read from peers the run of ``hashes`` after the longest prefix held here (``held``
        blocks, if the caller just looked), keep it here; how many blocks came."""
        if held is None:
            held = self._store.lookup(ns.name, hashes).prefix_blocks
        if held >= len(hashes):
            return 0
        started = time.perf_counter()
        receive = partial(self._receive if self._store.host_slab() is not None
                          else self._receive_bytes, ns)
        try:
            got = fetch_run(self.node, self._peers, ns, hashes[held:], receive)
        except RedisError as exc:
            log.debug("no peer lookup for %s: Redis does not answer (%s)", ns.name, exc)
            return 0
        if got:
            self.node.count_fetched(got, got * ns.block_bytes, time.perf_counter() - started)
        return got

    def _receive(self, ns: Namespace, src: NodeView,
                 hashes: Sequence[BlockHash]) -> list[bool] | None:
        """Read ``hashes`` from ``src`` into places reserved here and publish the leading run
        that landed; whether each block landed (None: no room here, or the namespace went)."""
        owner = f"{FILL_OWNER}{next(_ids)}"
        store = self._store
        try:
            extents = store.reserve_write(ns.name, hashes, lease_s=FILL_LEASE_S, owner=owner,
                                          receiving=True).extents
        except KVStoreError as exc:  # no room, the namespace deleted: a miss
            log.info("no room here for %d blocks from peers: %s", len(hashes), exc)
            return None
        try:
            host = cast(HostTier, store.tier("host"))
            places = [[host.view(off, n) for off, n in ext] if ext is not None else None
                      for ext in extents]
            # one piece: straight into it; in pieces, or stored here already: into a buffer
            buffers: list[Buffer] = [p[0] if p is not None and len(p) == 1
                                     else bytearray(ns.block_bytes) for p in places]
            landed = self._peers.read_into(src, ns, hashes, buffers)
            run = next((i for i, got in enumerate(landed) if got is None), len(landed))
            keep: list[BlockHash] = []
            sums: list[int | None] = []
            for i, (got, where) in enumerate(zip(landed[:run], places, strict=False)):
                if got is not None and where is not None:
                    if len(where) > 1:
                        _scatter(buffers[i], where)
                    keep.append(hashes[i])
                    sums.append(got.checksum)
            try:
                store.commit_write(ns.name, keep, owner=owner, sums=sums, landed=sums)
            except KVStoreError as exc:  # the namespace deleted meanwhile: a miss
                log.info("%d blocks read from peers could not be kept: %s", len(keep), exc)
                return None
            return [got is not None for got in landed]
        finally:  # every place not published is freed: those after the run, or all on error
            with contextlib.suppress(Exception):  # a closing store frees them itself
                store.abort_write(ns.name, hashes, owner=owner)

    def _receive_bytes(self, ns: Namespace, src: NodeView,
                       hashes: Sequence[BlockHash]) -> list[bool] | None:
        """:meth:`_receive` for a store without a host slab: the peer's bytes, then a put."""
        blocks = self._peers.read(src, ns, hashes)
        run = next((i for i, b in enumerate(blocks) if b is None), len(blocks))
        try:
            self._store.put(ns.name, hashes[:run], [b for b in blocks[:run] if b is not None])
        except KVStoreError as exc:  # no room, the namespace deleted meanwhile: a miss
            log.info("%d blocks read from peers could not be kept: %s", run, exc)
            return None
        return [b is not None for b in blocks]

    def close(self) -> None:
        """Leave the cluster (:meth:`ClusterNode.close`) and close the peers' clients."""
        self.node.close()
        self._peers.close()


def _scatter(buffer: Buffer, places: list[memoryview]) -> None:
    """Copy a block received into ``buffer`` to its places, in order."""
    src = memoryview(buffer).cast("B")
    at = 0
    for view in places:
        view[:] = src[at:at + view.nbytes]
        at += view.nbytes
