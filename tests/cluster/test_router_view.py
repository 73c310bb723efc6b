"""The router's view of a cluster, over a real ``redis-server`` with nodes beating and
publishing as real nodes do: where a prompt's prefix lies per node, read fresh from Redis (a
router that restarts knows it at once), and the worker beside the node that holds it ranked
first, a peer's copy priced above the worker's own node's and below recomputing."""

from __future__ import annotations

import asyncio
import os

from engines.router.cost import CostModel
from engines.router.planning import Planner
from engines.router.policies import Ask
from engines.router.workers import Worker
from kvstore.cluster.config import ClusterConfig
from kvstore.cluster.index import ClusterIndex
from kvstore.cluster.keys import TIER_CODES
from kvstore.cluster.link import connect
from kvstore.cluster.members import Membership
from kvstore.cluster.view import ClusterView, Placement
from kvstore.protocol.cluster import NodeReport
from kvstore.testing.redis_server import RedisServer
from tests.cluster.conftest import quick

HOST, DISK = TIER_CODES["host"], TIER_CODES["disk"]


def join(url: str, node_id: str, peer_rate: float | None = None) -> int:
    members = Membership(connect(url)[0], quick(url, node_id))
    slot, _ = members.join()
    members.beat(slot, NodeReport(node_id=node_id, address="127.0.0.1:1", version="t",
                            started_at=0, peer_read_bytes_per_s=peer_rate))
    return slot


def view(url: str) -> ClusterView:
    return ClusterView(ClusterConfig.beating(url, "router", "", 0.1))


def test_the_placement_of_a_chain_per_node_read_from_redis(redis_server: RedisServer) -> None:
    url = redis_server.url
    slots = {n: join(url, n, rate) for n, rate in (("n1", None), ("n2", 2e9), ("n3", 1e9))}
    chain = [os.urandom(32) for _ in range(8)]
    index = ClusterIndex(connect(url)[0], 16)
    index.publish(slots["n2"], [("chat", h, HOST) for h in chain[:6]])
    index.publish(slots["n3"], [("chat", h, DISK) for h in chain[:3] + chain[5:]])
    placed = view(url).placement("chat", chain)
    # n2 holds blocks 0-5, n3 blocks 0-2 and 5-7: 0-7 are held somewhere, n3's own run is 3
    assert placed == Placement(8, {"n2": 6, "n3": 3}, 1.5e9)
    assert view(url).placement("chat", [os.urandom(32)] + chain) == Placement(0, {}, 1.5e9)
    assert view(url).placement("other", chain).anywhere == 0


def test_the_worker_beside_the_node_holding_the_prefix_goes_first(
        redis_server: RedisServer) -> None:
    url = redis_server.url
    slots = {n: join(url, n) for n in ("n1", "n2", "n3")}
    chain = [os.urandom(32) for _ in range(8)]
    ClusterIndex(connect(url)[0], 16).publish(slots["n2"], [("chat", h, HOST) for h in chain])
    w1, w2, w3 = (Worker(f"http://w{i}", node=f"n{i}") for i in (1, 2, 3))
    alone = Worker("http://w0")  # a worker whose kvstore is not in the cluster
    pool = [w1, w3, alone, w2]
    ask = Ask(chain, n_tokens=8 * 16 + 5, max_tokens=4, session=None, store=0, block_size=16,
              block_bytes=4096)
    planner = Planner([pool], "kv", CostModel(), None, view(url))
    plan = asyncio.run(planner.rank(pool, ask, "chat"))
    assert plan.order[0] is w2 and plan.store_blocks == 8
    model, prices = CostModel(), CostModel().prices(pool)

    def cost(w: Worker, near: int | None) -> float:
        return model.cost(w, prices[w], n_tokens=ask.n_tokens, local=0, store=8,
                          block_size=16, near=near)
    # own node < a peer's copy < recomputing the whole prompt
    assert cost(w2, 8) < cost(w1, 0) < model.cost(w1, prices[w1], n_tokens=ask.n_tokens,
                                                  local=0, store=0, block_size=16)
