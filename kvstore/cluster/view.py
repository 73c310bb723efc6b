"""A cluster seen from outside, for a router: how much of a chain each node holds.

Read-only: it never joins, beats or publishes. It reads the nodes' states (at most once per
``heartbeat_s``) and, per request, the index records of the chain's blocks (one pipelined read),
so a router that restarts knows where every prefix lies at once, from Redis, without waiting
for its workers' events. While Redis does not answer it knows nothing (an empty placement) and
the router routes as it would without a cluster.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.cluster.config import ClusterConfig
from kvstore.cluster.index import ClusterIndex
from kvstore.cluster.keys import SETTINGS
from kvstore.cluster.link import RedisClient, RedisError, connect
from kvstore.cluster.members import Membership, Roster
from kvstore.cluster.urls import masked

log = logging.getLogger("kvstore.cluster")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a chain lies: its longest prefix held by some node that is up (``anywhere``),
    each up node's own longest prefix (``by_node``, by node id; nodes holding none left out),
    and the fleet's median measured peer read rate (None: not measured yet)."""

    anywhere: int = 0
    by_node: dict[str, int] = field(default_factory=dict)
    peer_bytes_per_s: float | None = None


class ClusterView:
    """The placement of chains in the cluster at ``url`` (nodes judged with ``config``'s
    timings: they must match the nodes' heartbeat)."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._link: tuple[RedisClient, Membership, ClusterIndex] | None = None
        self._roster: Roster | None = None
        self._roster_at = 0.0

    def placement(self, namespace: str, hashes: Sequence[bytes]) -> Placement:
        if not hashes:
            return Placement()
        try:
            _, members, index = self._linked()
            roster = self._fresh_roster(members)
            found = index.where(namespace, hashes)
        except RedisError as exc:
            log.warning("cluster at %s does not answer (%s): routing without it",
                        masked(self._config.url), exc)
            with self._lock:
                self._link = None
            return Placement()
        up = {slot: n.node_id for slot, n in roster.up_slots().items()}
        anywhere, by_node = 0, dict.fromkeys(up.values(), 0)
        unbroken = set(up.values())  # the nodes holding every block so far
        for holders in found:
            here = {up[h.slot] for h in holders if h.slot in up}
            if not here:
                break
            anywhere += 1
            unbroken &= here
            for node in unbroken:
                by_node[node] += 1
        rates = [r for n in roster.nodes if (r := n.peer_read_bytes_per_s)]
        return Placement(anywhere, {k: v for k, v in by_node.items() if v},
                         statistics.median(rates) if rates else None)

    def _linked(self) -> tuple[RedisClient, Membership, ClusterIndex]:
        with self._lock:
            if self._link is None:
                client, _ = connect(self._config.url)
                bits = client.hget(SETTINGS, "index_bits")
                index = ClusterIndex(client, int(bits) if bits is not None
                                     else self._config.index_bits)
                self._link = (client, Membership(client, self._config), index)
            return self._link

    def _fresh_roster(self, members: Membership) -> Roster:
        now = time.monotonic()
        with self._lock:
            if self._roster is not None and now - self._roster_at < self._config.heartbeat_s:
                return self._roster
        roster = members.roster()
        with self._lock:
            self._roster, self._roster_at = roster, now
        return roster
