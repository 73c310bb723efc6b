"""The scale section of ``bench_cluster.py``: what a cluster of 16 to 1,024 nodes asks of
Redis (memory, calls, CPU, index staleness, Redis Cluster masters), modelled from costs
measured in the same run on a real ``redis-server`` and a 3-master Redis Cluster.

Measured, with the node's own code (``ClusterIndex``, ``Membership``) against Redis on
loopback, pipelined as a node sends:

- Redis memory per index entry with 1 and with 3 holders, buckets filled as the docs advise
  (~64 blocks each);
- Redis main-thread CPU per index publish script call and per lookup ``HMGET``, hence one
  Redis server's capacity (calls/s at one core), against the calls/s that one Python client
  sent; script calls per batch of 256 changes and ``HMGET`` per lookup of 32 blocks, round
  trips per batch (one per shard);
- membership: CPU of one heartbeat (beat and list) as a function of the nodes listed, and the
  bytes of a report (a node lists every node, reading their reports now and then).

Modelled (``bench/cluster_scale_model.py``), for 16, 64, 256 and 1,024 nodes at the per-node
load of its ``Load`` (the assumptions): Redis memory, calls/s, CPU, index staleness and Redis
Cluster masters; and the largest fleet one Redis serves.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from bench.cluster_scale_model import (
    IndexCost,
    Load,
    MemberCost,
    Scale,
    largest,
    model,
    plot_scale,
)
from bench.common import row
from bench.redis_info import RedisSample, sample
from kvstore.cluster.config import ClusterConfig
from kvstore.cluster.index import ClusterIndex
from kvstore.cluster.keys import bucket_key
from kvstore.cluster.link import RedisClient, connect, pipelines
from kvstore.cluster.members import Membership
from kvstore.protocol.cluster import NodeReport, TierReport
from kvstore.testing.redis_server import RedisCluster, RedisServer

PUBLISH_BATCH = 256  # changes per publish call of the measurement
LOOKUP_BATCH = 32  # hashes per lookup
BLOCKS_PER_BUCKET = 64  # the fill the docs advise (index_bits near log2(blocks / 64))
NS = "scale"


def index_bits(blocks: int) -> int:
    return max(0, round(math.log2(blocks / BLOCKS_PER_BUCKET)))


class Redis(NamedTuple):
    """One Redis deployment under measurement: a node's client and its servers."""

    client: RedisClient
    servers: Sequence[RedisServer]


def measure_index(deployments: Sequence[Redis], blocks: int, rounds: int) -> list[IndexCost]:
    """Per deployment: publish ``blocks`` entries for one holder (memory), then in
    ``rounds`` interleaved rounds (A B A B ...) a slice's records of two more holders and
    lookups of it (CPU per call, calls/s sent; medians), then memory with three holders."""
    bits = index_bits(blocks)
    hashes = [os.urandom(32) for _ in range(blocks)]
    indexes = [ClusterIndex(d.client, bits) for d in deployments]
    empty = [sample(d.servers) for d in deployments]
    filled: list[RedisSample] = []
    for d, index, zero in zip(deployments, indexes, empty, strict=True):
        _publish(index, (1,), hashes)
        filled.append(sample(d.servers).since(zero))
    rng = random.Random(0)
    per: list[dict[str, list[float]]] = [{} for _ in deployments]
    for part in range(rounds):
        chunk = hashes[part::rounds]
        lookups = [rng.sample(chunk, LOOKUP_BATCH) for _ in range(len(chunk) // 16)]
        for d, index, got in zip(deployments, indexes, per, strict=True):
            _timed(d, got, "publish", partial(_publish, index, (2, 3), chunk),
                   2 * -(-len(chunk) // PUBLISH_BATCH))
            _timed(d, got, "lookup", partial(_lookup, index, lookups), len(lookups))
    keys = {bucket_key(NS, h, bits) for h in hashes[:PUBLISH_BATCH]}
    out = []
    for d, got, one, zero in zip(deployments, per, filled, empty, strict=True):
        med = {k: statistics.median(v) for k, v in got.items()}
        three = sample(d.servers).memory - zero.memory
        out.append(IndexCost(
            bytes_1=one.memory / blocks, bytes_3=three / blocks,
            publish_us=med["publish_us"], lookup_us=med["lookup_us"],
            publish_sent_s=med["publish_sent_s"], lookup_sent_s=med["lookup_sent_s"],
            calls_per_publish=med["publish_per_batch"], calls_per_lookup=med["lookup_per_batch"],
            round_trips=len(pipelines(d.client, keys))))
    return out


def _publish(index: ClusterIndex, slots: Sequence[int], hashes: Sequence[bytes]) -> None:
    """Records of each of ``slots`` for ``hashes``, in batches of :data:`PUBLISH_BATCH`."""
    for slot in slots:
        for i in range(0, len(hashes), PUBLISH_BATCH):
            index.publish(slot, [(NS, h, 1) for h in hashes[i:i + PUBLISH_BATCH]])


def _lookup(index: ClusterIndex, batches: Sequence[Sequence[bytes]]) -> None:
    for batch in batches:
        index.where(NS, batch)


COMMANDS = {"publish": "evalsha", "lookup": "hmget"}  # the Redis command each sends


def _timed(d: Redis, got: dict[str, list[float]], name: str, work: Callable[[], None],
           batches: int) -> None:
    """Run ``work`` against ``d``; note in ``got`` its command's main-thread CPU per call
    (``<name>_us``), calls/s sent and calls per batch."""
    before, start = sample(d.servers), time.perf_counter()
    work()
    wall, used = time.perf_counter() - start, sample(d.servers).since(before)
    n = used.calls.get(COMMANDS[name], 0)
    for key, value in (("us", used.cpu_s / max(1, n) * 1e6), ("sent_s", n / wall),
                       ("per_batch", n / batches)):
        got.setdefault(f"{name}_{key}", []).append(value)


def measure_members(client: RedisClient, servers: Sequence[RedisServer], sizes: Sequence[int],
                    beats: int) -> MemberCost:
    """CPU of ``beats`` heartbeats (beat + roster) with ``sizes`` nodes listed; a straight
    line through the first and last size."""
    report = NodeReport(node_id="node-0000", address="10.0.0.1:8471",
                        rest_url="http://10.0.0.1:8470", version="0.0.0",
                        started_at=time.time(), blocks=1 << 20, peer_read_bytes_per_s=1e9,
                        tiers=[TierReport(name=n, capacity_bytes=c, used_bytes=c, blocks=b)
                               for n, c, b in (("device", 64 << 30, 32768),
                                               ("host", 256 << 30, 131072),
                                               ("disk", 1792 << 30, 917504))])
    base = ClusterConfig(url="", node_id="node-0000", address=report.address)
    listed = 0
    cost: list[float] = []
    for size in sizes:
        for i in range(listed, size):
            cfg = replace(base, node_id=f"node-{i:04d}")
            other = Membership(client, cfg)
            other.beat(other.join()[0], report.model_copy(update={"node_id": cfg.node_id}))
        listed = size
        me = Membership(client, base)
        slot = me.join()[0]
        before = sample(servers)
        for _ in range(beats):
            me.beat(slot, report)
            me.roster()
        cost.append(sample(servers).since(before).cpu_s / beats * 1e6)
    per_node = (cost[-1] - cost[0]) / (sizes[-1] - sizes[0])
    return MemberCost(max(0.0, cost[0] - per_node * sizes[0]), per_node,
                      len(report.model_dump_json()) + 40)  # + id, score and slot


def scale_rows(root: Path, quick: bool, plot: str | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measure on one server and on a 3-master Redis Cluster, then model 16..1,024 nodes;
    the rows and the details (measurements, assumptions, the model's table)."""
    blocks = 1 << 15 if quick else 1 << 18
    single = RedisServer(root / "scale-redis")
    cluster = RedisCluster(root / "scale-cluster")
    try:
        single.start()
        cluster.start()
        one, clustered = connect(single.url)
        sharded_client, clustered = connect(cluster.url)
        assert clustered, "the Redis Cluster answered as one server"
        idx, sharded = measure_index([Redis(one, [single]),
                                      Redis(sharded_client, cluster.servers)],
                                     blocks, 5 if quick else 9)
        members = measure_members(one, [single], (16, 256) if quick else (16, 1024),
                                  50 if quick else 200)
        one.close()
        sharded_client.close()
    finally:
        single.stop()
        cluster.stop()
    load = Load()
    table = [model(n, load, idx, sharded, members) for n in (16, 64, 256, 1024)]
    at = partial(model, load=load, one=idx, sharded=sharded, mem=members)
    one_server = largest(lambda n: at(n).fits_one(load))
    any_cluster = largest(lambda n: at(n).masters > 0)
    if plot:
        plot_scale(table, load, idx, plot)
    rows = _measured_rows(idx, sharded, members, blocks) + [_model_row(s) for s in table] + [
        row("model: largest fleet one Redis serves", "nodes", one_server,
            higher_is_better=True),
        row("model: largest fleet whose heartbeats fit one master", "nodes", any_cluster,
            higher_is_better=True)]
    details = {"single": idx._asdict(), "cluster_3_masters": sharded._asdict(),
               "members": members._asdict(), "assumptions": asdict(load),
               "derived": {"changes_per_node_s": load.changes_s,
                           "reads_per_node_s": load.reads_s},
               "model": [{k: None if v == math.inf else v for k, v in s._asdict().items()}
                         for s in table],  # None: saturated (JSON has no infinity)
               "largest_fleet_one_server": one_server,
               "largest_fleet_heartbeats_one_master": any_cluster}
    return rows, details


def _measured_rows(idx: IndexCost, sharded: IndexCost, mem: MemberCost, blocks: int
                   ) -> list[dict[str, Any]]:
    return [
        row("Redis bytes per index entry, 1 holder", "bytes", idx.bytes_1,
            "3-master Redis Cluster", sharded.bytes_1, higher_is_better=False, entries=blocks),
        row("Redis bytes per index entry, 3 holders", "bytes", idx.bytes_3,
            "3-master Redis Cluster", sharded.bytes_3, higher_is_better=False, entries=blocks),
        row("Redis CPU per index publish call", "us", idx.publish_us,
            "3-master Redis Cluster", sharded.publish_us, higher_is_better=False, entries=blocks),
        row("Redis CPU per index lookup HMGET", "us", idx.lookup_us,
            "3-master Redis Cluster", sharded.lookup_us, higher_is_better=False, entries=blocks),
        row("one Redis: publish calls/s at one core", "calls/s", 1e6 / idx.publish_us,
            "calls/s one client sent", idx.publish_sent_s, higher_is_better=True, entries=blocks),
        row("one Redis: lookup HMGET/s at one core", "calls/s", 1e6 / idx.lookup_us,
            "calls/s one client sent", idx.lookup_sent_s, higher_is_better=True, entries=blocks),
        row(f"publish script calls per batch of {PUBLISH_BATCH} changes", "calls",
            idx.calls_per_publish, higher_is_better=False, entries=blocks),
        row(f"lookup HMGET per batch of {LOOKUP_BATCH} blocks", "calls",
            idx.calls_per_lookup, higher_is_better=False, entries=blocks),
        row("round trips per batch, 3-master Redis Cluster", "trips", sharded.round_trips,
            "one Redis", idx.round_trips, higher_is_better=False, entries=blocks),
        row("Redis CPU per heartbeat, per node listed", "us", mem.per_node_us,
            higher_is_better=False),
    ]


def _model_row(s: Scale) -> dict[str, Any]:
    return row(f"model, {s.nodes} nodes: CPU of one Redis", "share", s.cpu_index + s.cpu_beats,
               higher_is_better=False, memory_gib=round(s.memory_gib, 1), masters=s.masters)
