"""One server's part in a cluster: a heartbeat thread and a publishing thread beside the store.

The heartbeat thread connects to Redis (again and again while it does not answer), joins
(takes the node's slot), and beats every ``heartbeat_s`` with a report of the node's tiers.
The publishing thread sends the store's placement changes every ``publish_s`` and republishes
everything the node holds when a republication is owed: at start, after Redis was away (it
may have restarted empty) and after notes were dropped. While Redis does not answer the node
is ``degraded``: it serves what it holds as a node without a cluster would, and nothing waits
on Redis but these two threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.cluster.config import ClusterConfig
from kvstore.cluster.keys import TIER_CODES
from kvstore.cluster.link import RedisError, connect
from kvstore.cluster.members import Roster
from kvstore.cluster.publisher import Publisher
from kvstore.cluster.session import RedisSession
from kvstore.cluster.urls import masked
from kvstore.errors import NamespaceConflictError
from kvstore.namespace import Namespace
from kvstore.protocol.cluster import (
    ClusterStatus,
    NodeReport,
    NodeState,
    NodeView,
    PeerCounts,
    RedisView,
    TierReport,
)
from kvstore.store.api import StoreAPI

log = logging.getLogger("kvstore.cluster")


@dataclass(frozen=True, slots=True)
class Source:
    """A node a block can be fetched from, and the code of its highest tier holding it."""

    node: NodeView
    tier: int


# A node lists the other nodes at every beat in a fleet of up to this many, and every
# ceil(nodes / LIST_FANOUT) beats in a larger one: each listing costs Redis a little per node
# listed, so listing at every beat would cost it nodes^2 per beat period; this keeps it linear
# (LIST_FANOUT listings of the whole fleet per beat period) at the price of a roster up to that
# many beats old in a large fleet (a peer's death is then seen later; reading from a dead peer
# fails fast and another copy is read).
LIST_FANOUT = 128


class ClusterNode:
    """Runs one node's membership and index publication for ``store``."""

    def __init__(self, config: ClusterConfig, store: StoreAPI, version: str) -> None:
        self.config = config
        self._store = store
        self._version = version
        self._started_at = time.time()
        self._publisher = Publisher([TIER_CODES.get(n) for n in store.tier_names()],
                                    config.max_pending)
        self._stop = threading.Event()
        self._state = threading.Lock()  # guards the fields below
        self._link: RedisSession | None = None
        self._slot: int | None = None
        self._connected = False
        self._error: str | None = None
        self._resync_owed = True
        self._roster: Roster | None = None  # as of the last heartbeat
        self._orphans = 0  # forgotten nodes' slots whose records await a sweep (last beat)
        self._beats = 0  # (the beat thread's alone)
        self._list_every = 1  # beats between two listings of the nodes
        self._fetched_blocks = self._fetched_bytes = 0
        self._fetch_s = 0.0
        self._threads = [threading.Thread(target=self._run, args=(f, p), name=n, daemon=True)
                         for f, p, n in ((self._beat_once, config.heartbeat_s, "cluster-beat"),
                                         (self._publish_once, config.publish_s, "cluster-index"))]

    # -- life --------------------------------------------------------------------------------
    def start(self) -> None:
        self._store.watch_placement(self._publisher)
        self._store.watch_namespaces(self)
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        """Stop both threads, publish what is noted and say the node left (best effort)."""
        self._store.watch_placement(None)
        self._store.watch_namespaces(None)
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        link, slot = self._link, self._slot
        if link is None or slot is None:
            return
        try:
            self._publisher.flush(link.index, slot)
            link.sweeper.resign()
            link.members.leave()
        except RedisError as exc:
            log.warning("could not say goodbye to Redis: %s", exc)
        link.client.close()

    def _run(self, step: Callable[[], None], period_s: float) -> None:
        while not self._stop.is_set():
            try:
                step()
            except RedisError as exc:
                self._failed(exc)
            except Exception:  # a bug must not stop the node's heartbeat for good
                log.exception("unexpected error in %s", threading.current_thread().name)
            self._stop.wait(period_s)

    # -- the two threads ---------------------------------------------------------------------
    def _beat_once(self) -> None:
        link = self._link
        if link is None:
            client, clustered = connect(self.config.url)
            link = RedisSession(client, clustered, self.config)
            with self._state:
                self._link = link
        slot = self._slot
        if not self._connected or slot is None:
            slot = self._join(link)
        orphans = link.members.beat(slot, self._report())
        if orphans is None:  # pruned while silent: its old slot's records are swept
            log.warning("node %s was forgotten by the cluster (silent past forget_after_s); "
                        "joining again", self.config.node_id)
            orphans = link.members.beat(self._join(link), self._report())
        self._beats += 1
        roster = self._roster
        if roster is None or not self._connected or self._beats % self._list_every == 0:
            roster = link.members.roster()
            self._list_every = max(1, -(-len(roster.nodes) // LIST_FANOUT))
        with self._state:
            self._roster = roster
            self._orphans = orphans or 0
            if not self._connected:
                log.info("connected to Redis at %s", masked(self.config.url))
            self._connected, self._error = True, None

    def _join(self, link: RedisSession) -> int:
        """Join (again): this node's slot, everything it holds owed to the index under it."""
        slot = link.join(self.config)
        with self._state:
            if slot != self._slot:
                log.info("node %s joined as slot %d", self.config.node_id, slot)
            self._slot, self._resync_owed = slot, True
        return slot

    def _publish_once(self) -> None:
        with self._state:
            link, slot, owed = self._link, self._slot, self._resync_owed
        if link is None or slot is None or not self._connected:
            return
        if owed or self._publisher.take_overflow():
            with self._state:
                self._resync_owed = False
            try:
                self._claim_held(link)
                done = self._publisher.resync(link.index, slot, self._store.placements(),
                                              self._stop.is_set)
            except RedisError:
                with self._state:
                    self._resync_owed = True
                raise
            if not done:
                return
        self._publisher.flush(link.index, slot)
        with self._state:
            orphans = self._orphans
        if orphans or link.sweeper.leading:
            link.sweeper.step()

    def _failed(self, exc: Exception) -> None:
        with self._state:
            if self._connected or self._error is None:
                log.warning("Redis at %s does not answer (%s); serving what this "
                            "node holds until it does", masked(self.config.url), exc)
            self._connected, self._error = False, str(exc) or type(exc).__name__
            self._roster = None

    # -- what it says ------------------------------------------------------------------------
    def _report(self) -> NodeReport:
        stats = self._store.stats()
        tiers = [TierReport(name=name, capacity_bytes=t.capacity_bytes, used_bytes=t.bytes,
                            blocks=t.blocks) for name, t in stats.tiers.items()]
        with self._state:
            rate = self._fetched_bytes / self._fetch_s if self._fetch_s > 0 else None
        return NodeReport(node_id=self.config.node_id, address=self.config.address,
                          rest_url=self.config.rest_url, version=self._version,
                          started_at=self._started_at, blocks=stats.totals.blocks, tiers=tiers,
                          peer_read_bytes_per_s=rate)

    @property
    def connected(self) -> bool:
        """Whether Redis answered the last heartbeat (a read of one field: no lock taken)."""
        return self._connected

    def roster(self) -> Roster | None:
        """Every node as Redis listed it at the last heartbeat (None while Redis does not
        answer). Asks nothing of Redis: a status or a scrape never waits on it."""
        with self._state:
            return self._roster

    def holders(self, namespace: str, hashes: Sequence[bytes]) -> list[list[Source]]:
        """For each of ``hashes``, the other nodes that are up and hold it, best tier first
        (none for each while Redis does not answer). Raises ``RedisError`` if Redis fails."""
        with self._state:
            link, me, roster = self._link, self._slot, self._roster
        if link is None or roster is None or not self._connected:
            return [[] for _ in hashes]
        up = roster.up_slots()
        return [sorted((Source(up[h.slot], h.tier) for h in found
                        if h.slot != me and h.slot in up), key=lambda s: s.tier)
                for found in link.index.where(namespace, hashes)]

    # -- namespaces (the store asks: NamespaceClaims) ----------------------------------------
    def claim(self, ns: Namespace) -> None:
        """Refuse ``ns`` (``NamespaceConflictError``) if a node not gone holds a namespace of
        that name with another definition. While Redis does not answer the node decides
        alone; the claim is made when it joins again."""
        link, live = self._link, self._live_ids()
        if link is None or live is None:
            return
        try:
            link.claims.claim(ns, live)
        except RedisError as exc:
            self._failed(exc)

    def release(self, name: str) -> None:
        link = self._link
        if link is None or not self._connected:
            return
        try:
            link.claims.release(name)
        except RedisError as exc:
            self._failed(exc)

    def _claim_held(self, link: RedisSession) -> None:
        """Claim every namespace the store holds (at each join): a conflict found here is
        logged, and reads of that namespace from peers are refused by the peers."""
        live = self._live_ids() or [self.config.node_id]
        for ns in self._store.namespaces():
            try:
                link.claims.claim(ns, live)
            except NamespaceConflictError as exc:
                log.error("%s", exc)

    def _live_ids(self) -> list[str] | None:
        """The ids of the nodes not gone, this one first (None while Redis does not answer)."""
        with self._state:
            roster, connected = self._roster, self._connected
        if roster is None or not connected:
            return None
        others = [n.node_id for n in roster.nodes
                  if n.state is not NodeState.GONE and n.node_id != self.config.node_id]
        return [self.config.node_id, *others]

    def count_fetched(self, blocks: int, nbytes: int, seconds: float) -> None:
        """Blocks read from peers and kept here, and the time the reads took."""
        with self._state:
            self._fetched_blocks += blocks
            self._fetched_bytes += nbytes
            self._fetch_s += seconds

    def correct(self, node: NodeView, namespace: str, hashes: Sequence[bytes]) -> None:
        """``node`` answered that it holds none of ``hashes``: remove its records of them."""
        link = self._link
        if link is not None:
            link.index.correct(node.slot, namespace, hashes)

    def status(self) -> ClusterStatus:
        roster = self.roster()
        with self._state:
            redis = RedisView(url=masked(self.config.url), connected=self._connected,
                              degraded=not self._connected, error=self._error,
                              cluster_mode=self._link is not None and self._link.clustered)
            slot = self._slot
            fetched = PeerCounts(blocks=self._fetched_blocks, bytes=self._fetched_bytes,
                                 seconds=round(self._fetch_s, 6))
        c = self.config
        link = self._link
        index = self._publisher.view()
        index.swept = link.sweeper.swept if link is not None else 0
        return ClusterStatus(node_id=c.node_id, slot=slot, redis=redis,
                             index=index, fetched=fetched,
                             heartbeat_s=c.heartbeat_s,
                             suspect_after_s=c.suspect_after_s, gone_after_s=c.gone_after_s,
                             nodes=roster.nodes if roster is not None else [])
