"""A routing decision (:class:`Plan`): the live workers of a pool ranked by the router's policy,
with the prefix kvstore holds (looked up only for a policy that prices it) and the work the
request adds to each worker.

:class:`Planner` owns what ranking needs and nothing else: the policy of each pool, the cost
model, the store the prefixes are looked up in and the rotation that breaks ties. Which pool,
and the hash recipe, are the router's (:class:`engines.router.core.Router`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import NamedTuple

from engines.router.cost import CostModel
from engines.router.policies import Ask, make_policy
from engines.router.workers import Job, Worker
from engines.store_io import BlockStore
from kvstore.cluster.view import ClusterView

log = logging.getLogger(__name__)


class Plan(NamedTuple):
    """A routing decision: workers best first and the work the request adds to each."""

    hashes: list[bytes]
    order: list[Worker]
    store_blocks: int
    work: dict[Worker, Job]


class Planner:
    """Ranks the live workers of the pools it was made with; owned by one asyncio loop."""

    def __init__(self, pools: list[list[Worker]], policy: str, cost: CostModel,
                 store: BlockStore | None, cluster: ClusterView | None = None) -> None:
        self.store = store
        self.cluster = cluster  # where prefixes lie across kvstore nodes (kvstore.cluster)
        self._policies = {id(pool): make_policy(policy, pool, cost) for pool in pools}
        self._rr = itertools.count()

    async def rank(self, pool: list[Worker], ask: Ask, namespace: str,
                   index_namespace: str = "") -> Plan:
        """Live workers of ``pool`` (one given to the constructor), best first, for ``ask``
        (whose ``store`` is looked up here, in ``namespace``, when the policy prices it; in
        the cluster's index under ``index_namespace``, the store's own name of it, if given)."""
        now = time.monotonic()
        live = [w for w in pool if w.available(now)]
        turn = next(self._rr)
        # policies sort stably: equal workers keep this rotation (round-robin among equals)
        rotated = [live[(turn + i) % len(live)] for i in range(len(live))]
        policy = self._policies[id(pool)]
        if policy.uses_store and self.cluster is not None:
            ask = await self._placed(ask, index_namespace or namespace, self.cluster)
        elif policy.uses_store:
            ask = ask._replace(store=await self._store_prefix(ask.hashes, namespace))
        order = policy.rank(rotated, ask)
        bs, stored = ask.block_size, ask.store
        work = {w: Job(ask.n_tokens + ask.max_tokens,
                       ask.n_tokens - bs * max(w.local_prefix(ask.hashes), stored), ask.hashes)
                for w in order}
        return Plan(ask.hashes, order, stored, work)

    @staticmethod
    async def _placed(ask: Ask, namespace: str, cluster: ClusterView) -> Ask:
        """``ask`` with where its prefix lies across the cluster's nodes."""
        if not ask.hashes or not namespace:
            return ask
        placed = await asyncio.to_thread(cluster.placement, namespace, ask.hashes)
        rate = placed.peer_bytes_per_s
        peer_s = ask.block_bytes / ask.block_size / rate if rate and ask.block_bytes else None
        return ask._replace(store=placed.anywhere, near=placed.by_node, peer_s=peer_s)

    async def _store_prefix(self, hashes: list[bytes], namespace: str) -> int:
        if self.store is None or not hashes or not namespace:
            return 0
        try:
            return await asyncio.to_thread(self.store.lookup, namespace, hashes)
        except Exception:  # the store is advisory here: routing goes on without it
            log.exception("kvstore lookup failed")
            return 0
