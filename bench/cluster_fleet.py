"""The fleet section of ``bench_cluster.py``: one trace's token hit rate on four ``kvstore
serve`` nodes in a cluster, against four isolated nodes and four that share only an S3 tier.

The trace (chats, RAG and one-off prompts, ``engines/workload.py``) is replayed at its own
arrival times on the three fleets at once:

- **cluster**: the four nodes in one cluster over one ``redis-server`` (a node's lookup reads
  from its peers the blocks it lacks and they hold);
- **isolated**: four nodes alone;
- **S3-only sharing**: four nodes alone, each with its memory tier over one shared S3 tier
  (SeaweedFS): a block a node evicts is demoted into the bucket, where every node's lookup
  finds it.

The requests are spread over the nodes as a fleet without a KV-aware router spreads them:
round-robin in arrival order, so a chat's turns land on different nodes. Per request, on its
node, as an engine does: ``lookup`` of the prompt's block hash chain (its full blocks, the
last prompt token always computed, as ``reuse_bound`` counts), ``get`` of the hit (the blocks
the engine loads), then ``put`` of the blocks after the hit (what prefill computed). The hit
is the leading run the get returned.

Every node holds an eighth of the trace's distinct blocks in its memory tier (no disk tier),
so that the fleet's memory holds half of the working set and eviction decides what is hit.
Rows: the fleet's token hit rate, cluster against isolated and against S3-only sharing, and
against one cache that never evicts (the trace's reuse bound); where the cluster's hits came
from (the node's own tier or a peer, from the nodes' ``fetched`` counters) and the S3 fleet's
(lookup tiers); the cluster's Redis index reads per prompt block and scripts per index
change.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from bench.common import row
from bench.redis_info import RedisSample, sample
from engines.workload import Request, WorkloadConfig, generate, reuse_bound
from kvstore.client import KVStoreClient
from kvstore.keys import block_hashes
from kvstore.testing.proc import ChildProc
from kvstore.testing.redis_server import RedisServer
from kvstore.testing.seaweed import SeaweedServer
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash

NAMESPACE = "fleet"
NODES = 4
BLOCK_TOKENS = 16  # tokens per block, vLLM's default
BLOCK_BYTES = 8 << 10  # bytes per block: small, so that the replay keeps up on two cores
CAPACITY_SHARE = 1 / 8  # of the trace's distinct blocks, per node's memory tier
FLEETS = ("cluster", "isolated", "s3")


def trace(quick: bool) -> WorkloadConfig:
    """The workload: lengths a tenth of the full-scale figures (a RAG prompt ~760 tokens),
    sessions arriving at 20/s and chat turns 1 s apart, so that the replay lasts ~20 s."""
    return WorkloadConfig(sessions=100 if quick else 300, session_rate=20.0,
                          think_s=1.0).scaled(0.1)


class Job(NamedTuple):
    """One request as the fleet sees it: when, on which node, its chain and prompt length."""

    at: float
    node: int
    hashes: list[BlockHash]
    tokens: int


def jobs_of(reqs: Sequence[Request]) -> list[Job]:
    """Round-robin over the nodes in arrival order; each prompt's full-block chain."""
    out = []
    for r in reqs:
        full = (len(r.prompt) - 1) // BLOCK_TOKENS
        out.append(Job(r.at, r.index % NODES,
                       block_hashes(r.prompt[:full * BLOCK_TOKENS], BLOCK_TOKENS),
                       len(r.prompt)))
    return out


@dataclass(slots=True)
class Replay:
    """What one fleet did with the trace."""

    tokens: int = 0
    hit_blocks: int = 0
    lost: int = 0  # blocks a lookup reported that the get right after did not return
    put_blocks: int = 0
    lateness: list[float] = field(default_factory=list)  # seconds each request started late
    hit_tiers: Counter[str] = field(default_factory=Counter)  # tier of each hit block
    error: BaseException | None = None

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks * BLOCK_TOKENS / self.tokens if self.tokens else 0.0


def replay(urls: Sequence[str], jobs: Sequence[Job], start: float, out: Replay) -> None:
    """Send ``jobs`` to the nodes at ``urls``, each at ``start + job.at`` (or at once when
    late), one at a time in arrival order; errors are kept in ``out.error``."""
    clients = [KVStoreClient(u, use_shm=False, transport="tcp") for u in urls]
    payload = os.urandom(BLOCK_BYTES)
    try:
        for c in clients:
            c.register_namespace(NAMESPACE, BLOCK_BYTES, {"model_id": "bench",
                                                          "block_size": BLOCK_TOKENS})
        for job in jobs:
            wait = start + job.at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            out.lateness.append(max(0.0, -wait))
            c = clients[job.node]
            prefix, tiers = c.lookup(NAMESPACE, job.hashes)
            got = c.get(NAMESPACE, job.hashes[:prefix]) if prefix else []
            hit = next((i for i, b in enumerate(got) if b is None), len(got))
            out.lost += prefix - hit
            out.hit_tiers.update(tiers[:hit])
            out.tokens += job.tokens
            out.hit_blocks += hit
            rest = job.hashes[hit:]
            if rest:
                out.put_blocks += len(rest)
                c.put(NAMESPACE, rest, [payload] * len(rest))
    except BaseException as exc:  # reported by the caller
        out.error = exc
    finally:
        for c in clients:
            c.close()


def at_once(calls: Sequence[Callable[[], object]]) -> None:
    """Run ``calls`` (processes' starts, each waiting for its readiness, or stops) in
    parallel; the first error is raised once all are done."""
    with ThreadPoolExecutor(len(calls)) as pool:
        for future in [pool.submit(c) for c in calls]:
            future.result()


def wait_joined(urls: Sequence[str], timeout_s: float = 60.0) -> None:
    """Until every node lists all of them up in its cluster view."""
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while True:
            doc = httpx.get(url + "/v1/cluster", timeout=5).json()
            if doc["redis"]["connected"] and \
                    sum(n["state"] == "up" for n in doc["nodes"]) == len(urls):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not form: {doc}")
            time.sleep(0.1)


def fleet_rows(root: Path, quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the three fleets on one trace; the rows and the details (per fleet: hit rate,
    hits by tier or source, lateness, evictions)."""
    cfg = trace(quick)
    reqs = generate(cfg)
    jobs = jobs_of(reqs)
    distinct = len({h for j in jobs for h in j.hashes})
    per_node = max(16, int(distinct * CAPACITY_SHARE))
    redis = RedisServer(root / "fleet-redis")
    weed = SeaweedServer(root / "fleet-weed", access_key=f"kv{secrets.token_hex(4)}",
                         secret_key=secrets.token_hex(16), bucket="fleet")
    procs: list[ChildProc] = [redis, weed]

    def node(name: str, *flags: str, env: dict[str, str] | None = None) -> ServerProc:
        # the memory tier only, a slot per block, an eighth of the working set
        return ServerProc(root / name, "--host-slot-bytes", str(BLOCK_BYTES), *flags, env=env,
                          host_capacity=str(per_node * BLOCK_BYTES), disk_capacity="0")
    try:
        at_once([redis.start, weed.start])
        s3_args, s3_env = weed.serve_args()
        cluster = ["--cluster", redis.url, "--cluster-heartbeat-s", "0.2"]
        fleets = {"cluster": [node(f"c{i}", *cluster, "--node-id", f"n{i}")
                              for i in range(NODES)],
                  "isolated": [node(f"i{i}") for i in range(NODES)],
                  "s3": [node(f"s{i}", *s3_args, env=s3_env) for i in range(NODES)]}
        nodes = [p for f in fleets.values() for p in f]
        procs += nodes
        at_once([p.start for p in nodes])
        urls = {name: [p.url for p in f] for name, f in fleets.items()}
        wait_joined(urls["cluster"])
        before = sample([redis])
        results = {name: Replay() for name in fleets}
        t0 = time.monotonic() + 0.5
        threads = [threading.Thread(target=replay, args=(urls[n], jobs, t0, results[n]))
                   for n in fleets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name, res in results.items():
            if res.error is not None:
                raise RuntimeError(f"the {name} fleet failed: {res.error!r}") from res.error
        time.sleep(0.3)  # the last index batch
        redis_used = sample([redis]).since(before)
        details = _details(urls, results, redis_used)
    finally:
        at_once([p.stop for p in procs[2:]])  # nodes first: they say goodbye to Redis
        at_once([redis.stop, weed.stop])
    bound = reuse_bound(reqs, BLOCK_TOKENS)
    details["trace"] = {"requests": len(jobs), "distinct_blocks": distinct,
                        "node_capacity_blocks": per_node, "block_bytes": BLOCK_BYTES,
                        "block_tokens": BLOCK_TOKENS, "routing": "round-robin",
                        "prompt_blocks": sum(len(j.hashes) for j in jobs),
                        "duration_s": round(jobs[-1].at, 1), "reuse_bound": bound,
                        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}}
    return _rows(results, details, bound), details


def _details(urls: dict[str, list[str]], results: dict[str, Replay],
             redis_used: RedisSample) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, res in results.items():
        stats = [httpx.get(u + "/v1/stats", timeout=5).json() for u in urls[name]]
        late = sorted(res.lateness)
        out[name] = {"hit_rate": res.hit_rate, "hit_blocks": res.hit_blocks,
                     "put_blocks": res.put_blocks, "lost_after_lookup": res.lost,
                     "hit_tiers": dict(res.hit_tiers),
                     "evictions": sum(s["totals"]["evictions"] for s in stats),
                     "late_p50_s": late[len(late) // 2], "late_max_s": late[-1]}
        if name == "s3":  # the S3 tier's own counters (gets, hits, discovered...), summed
            backends = [st["tiers"]["s3"].get("backend") or {} for st in stats]
            out[name]["s3_tier"] = {k: sum(b.get(k, 0) for b in backends)
                                    for k, v in backends[0].items()
                                    if isinstance(v, int | float) and not isinstance(v, bool)}
    views = [httpx.get(u + "/v1/cluster", timeout=5).json() for u in urls["cluster"]]
    out["cluster"]["peer_blocks"] = sum(v["fetched"]["blocks"] for v in views)
    out["cluster"]["index_published"] = sum(v["index"]["published"] for v in views)
    out["cluster"]["redis_calls"] = redis_used.calls
    # every heartbeat is two scripts (beat, list) and one ZADD; the other scripts publish
    out["cluster"]["publish_calls"] = redis_used.calls.get("evalsha", 0) - \
        2 * redis_used.calls.get("zadd", 0)
    return out


def _rows(results: dict[str, Replay], details: dict[str, Any], bound: float
          ) -> list[dict[str, Any]]:
    c, i, s = (results[n].hit_rate for n in FLEETS)
    d = details["cluster"]
    calls = d["redis_calls"]
    peer = d["peer_blocks"] / max(1, d["hit_blocks"])
    s3_share = details["s3"]["hit_tiers"].get("s3", 0) / max(1, details["s3"]["hit_blocks"])
    return [
        row("fleet token hit rate, cluster", "hit rate", c, "4 isolated nodes", i,
            higher_is_better=True),
        row("fleet token hit rate, cluster", "hit rate", c, "S3-only sharing", s,
            higher_is_better=True),
        row("fleet token hit rate, cluster", "hit rate", c, "one cache, no eviction", bound,
            higher_is_better=True),
        row("cluster hits read from a peer", "share", peer, higher_is_better=True),
        row("S3-only hits read from S3", "share", s3_share, higher_is_better=True),
        row("cluster Redis index reads (HMGET) per prompt block", "calls",
            calls.get("hmget", 0) / details["trace"]["prompt_blocks"], higher_is_better=False),
        row("cluster Redis index scripts per index change", "calls",
            d["publish_calls"] / max(1, d["index_published"]), higher_is_better=False),
    ]


def fleet_table(details: dict[str, Any]) -> list[dict[str, Any]]:
    """Per fleet: hit rate, where the hits came from, evictions and how late the replay ran
    (printable rows)."""
    out = []
    for name in FLEETS:
        d = details[name]
        peer = d.get("peer_blocks", d["hit_tiers"].get("s3", 0))
        out.append({"fleet": name, "token hit rate": d["hit_rate"], "hit blocks": d["hit_blocks"],
                    "from own tier": d["hit_blocks"] - peer, "from peer or S3": peer,
                    "put blocks": d["put_blocks"], "evictions": d["evictions"],
                    "lost after lookup": d["lost_after_lookup"],
                    "late p50 (s)": d["late_p50_s"], "late max (s)": d["late_max_s"]})
    return out
