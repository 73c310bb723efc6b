"""A cluster's costs, in ratios measured in one run on loopback: two ``kvstore serve`` nodes in
a cluster over one ``redis-server``, and a node alone.

- peer read: node B reads from node A a chain B lacks (a lookup on B brings it: index lookup in
  Redis, A's data plane, checksums, B's store), against a raw socket moving the same bytes
  (``bench/raw_socket.py``); target 0.8;
- put: TCP puts into a node in the cluster against the same into a node alone; target 0.9;
- lookup p99: a chain held on the node (cluster against alone), and a chain nobody holds
  (the cluster node asks Redis too);
- Redis: bytes of Redis memory per block published, and Redis calls per put;
- fleet (``bench/cluster_fleet.py``): a trace's token hit rate on four nodes in a cluster,
  against four isolated nodes and four sharing only an S3 tier;
- scale (``bench/cluster_scale.py``): Redis memory, calls, CPU and index staleness modelled
  for 16 to 1,024 nodes from costs measured on a real Redis and a 3-master Redis Cluster;
- cross-node hits (``bench/cluster_ttft.py``): the time to first token of a fresh engine, the
  built-in one and real vLLM (CPU build, ``KVStoreConnector``), whose long prefix is on its own
  node, only on a peer node (found through Redis), only in S3 (SeaweedFS, a node without a
  cluster) or nowhere (recomputed); the peer case against recomputing (target 5) and against
  S3 (target 3), against its own node (stated), and own and S3 against recomputing.

``--sections`` picks some of costs, fleet, scale and ttft; ``--quick`` runs all in several
minutes, most of them the cross-node TTFT rows (five engine processes per engine kind,
recomputing a 2k-token prefix three times each round); ``--no-vllm`` leaves vLLM out (where it
is not installed). With ``--json PATH`` the TTFT bars and the scale model are drawn beside it
(``PATH`` with ``-ttft.png`` and ``-scale.png``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cluster_fleet import fleet_rows, fleet_table
from bench.cluster_scale import scale_rows
from bench.cluster_scale_model import model_table
from bench.cluster_ttft import cross_node_ttft, plot
from bench.common import interleaved, report, row, table
from bench.raw_socket import RawServer
from kvstore.client import KVStoreClient
from kvstore.testing.redis_server import RedisServer
from kvstore.testing.server import ServerProc

LAYOUT = {"model_id": "bench", "block_size": 16}
SECTIONS = ("costs", "fleet", "scale", "ttft")


def chain(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not settle")
        time.sleep(0.1)


def redis_calls(redis: RedisServer) -> int:
    """Calls of every command Redis served so far (``INFO commandstats``)."""
    total = 0
    for line in redis.cli("info", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            total += int(line.split("calls=")[1].split(",")[0])
    return total


def redis_memory(redis: RedisServer) -> int:
    for line in redis.cli("info", "memory").splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":")[1])
    return 0


def costs(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """Two nodes in a cluster and a node alone: peer read, put, lookup and Redis rows."""
    n = 32 if args.quick else 128  # blocks per call
    reps = 3 if args.quick else 7
    block = args.block
    redis = RedisServer(root / "redis").start()
    flags = ["--cluster", redis.url, "--cluster-heartbeat-s", "0.2"]
    size = f"{max(256, 4 * n * block >> 20)}MiB"
    a = ServerProc(root / "a", *flags, "--node-id", "a", host_capacity=size).start()
    b = ServerProc(root / "b", *flags, "--node-id", "b", host_capacity=size).start()
    alone = ServerProc(root / "alone", host_capacity=size).start()
    raw = RawServer()
    rows = []
    try:
        ca, cb, cz = (KVStoreClient(s.url, use_shm=False, transport="tcp")
                      for s in (a, b, alone))
        for c in (ca, cb, cz):
            c.register_namespace("bench", block, LAYOUT)
        blocks = [os.urandom(block) for _ in range(n)]
        wait_for(lambda: len(KVStoreClient(a.url).stats().tiers) > 0)

        # -- peer read against a raw socket ---------------------------------------------
        held = chain(n)
        ca.put("bench", held, blocks)
        time.sleep(0.5)  # published within 0.1 s plus a round trip
        assert cb.lookup("bench", held)[0] == n, "B did not read the chain from A"

        def peer_read() -> None:
            cb.delete("bench", held)  # B forgets its copy; A's record stays
            got = cb.lookup("bench", held)[0]
            assert got == n, got

        def forget_only() -> None:
            cb.delete("bench", held)
        rc = raw.connect()
        rc.put(blocks)
        dest = [bytearray(block) for _ in range(n)]
        t_peer, t_forget, t_raw = interleaved(
            [peer_read, forget_only, lambda: rc.get_into(dest)], reps)
        nbytes = n * block
        peer = nbytes / max(1e-9, t_peer - t_forget) / 1e9
        rows.append(row("peer read (lookup on B brings A's chain)", "GB/s", peer,
                        "raw socket get", nbytes / t_raw / 1e9, higher_is_better=True,
                        target=0.8, block=block, blocks=n))

        # -- put with the cluster against alone -----------------------------------------
        calls0, mem0 = redis_calls(redis), redis_memory(redis)
        puts = {"a": 0}

        def put_on(c: KVStoreClient, tag: str) -> None:
            keys = chain(n)
            c.put("bench", keys, blocks)
            c.delete("bench", keys)
            puts[tag] = puts.get(tag, 0) + 1
        t_cluster, t_alone = interleaved([lambda: put_on(ca, "a"), lambda: put_on(cz, "z")],
                                         reps)
        rows.append(row("put + delete, node in a cluster", "GB/s", nbytes / t_cluster / 1e9,
                        "node alone", nbytes / t_alone / 1e9, higher_is_better=True,
                        target=0.9, block=block, blocks=n))
        time.sleep(0.5)
        calls = redis_calls(redis) - calls0
        rows.append(row("Redis calls per block put and deleted (beats included)", "calls",
                        calls / max(1, puts["a"] * n), higher_is_better=False))

        # -- lookups ------------------------------------------------------------------------
        local = chain(64)
        ca.put("bench", local, [blocks[0]] * 64)
        cz.put("bench", local, [blocks[0]] * 64)
        nobody = chain(64)

        def p99(c: KVStoreClient, hashes: list[bytes]) -> float:
            times = []
            for _ in range(50 if args.quick else 400):
                start = time.perf_counter()
                c.lookup("bench", hashes)
                times.append(time.perf_counter() - start)
            return statistics.quantiles(times, n=100)[98] * 1e3
        for label, hashes in (("held here", local), ("held nowhere", nobody)):
            alone_ms, cluster_ms = p99(cz, hashes), p99(ca, hashes)
            rows.append(row(f"lookup p99, 64 blocks {label}", "ms", cluster_ms, "node alone",
                            alone_ms, higher_is_better=False))

        # -- Redis memory per block -----------------------------------------------------------
        before = redis_memory(redis)
        many = chain(20 * n)
        small = [b"x" * 4096] * len(many)
        ca.register_namespace("mem", 4096, LAYOUT)
        for i in range(0, len(many), 256):
            ca.put("mem", many[i:i + 256], small[i:i + 256])
        time.sleep(0.5)
        rows.append(row("Redis memory per block published", "bytes",
                        (redis_memory(redis) - before) / len(many), higher_is_better=False,
                        index_bits=16, blocks=len(many)))
        del mem0
        for c in (ca, cb, cz):
            c.close()
        rc.close()
    finally:
        raw.close()
        for s in (a, b, alone):
            s.stop()
        redis.stop()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="several minutes, most of them the cross-node TTFT rows")
    p.add_argument("--json", default=None, help="write the report (and its plots) here")
    p.add_argument("--block", type=int, default=256 << 10, help="block bytes (costs)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, of: {', '.join(SECTIONS)}")
    p.add_argument("--no-vllm", action="store_true",
                   help="cross-node TTFT for the built-in engine only (no vLLM installed)")
    args = p.parse_args()
    sections = set(args.sections.split(","))
    if not sections <= set(SECTIONS):
        p.error(f"unknown sections {sorted(sections - set(SECTIONS))}")
    if "ttft" in sections and not args.no_vllm and importlib.util.find_spec("vllm") is None:
        p.error("vLLM is not importable: install it or pass --no-vllm")
    plots = Path(args.json) if args.json else None
    root = Path(tempfile.mkdtemp(prefix="kvcluster-"))
    rows = costs(args, root) if "costs" in sections else []
    extra: dict[str, Any] = {}
    if "fleet" in sections:
        fleet, extra["fleet"] = fleet_rows(root, args.quick)
        rows += fleet
        print(table(fleet_table(extra["fleet"])), end="\n\n")
    if "scale" in sections:
        scale_png = plots.with_name(f"{plots.stem}-scale.png") if plots else None
        scale, extra["scale"] = scale_rows(root, args.quick, str(scale_png) if scale_png else None)
        rows += scale
        print(table(model_table(extra["scale"])), end="\n\n")
    if "ttft" in sections:
        ttft = cross_node_ttft(args.quick, vllm=not args.no_vllm)
        rows += ttft
        if plots:
            plot(ttft, plots.with_name(f"{plots.stem}-ttft.png"))
    report("bench_cluster", rows, args.json, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
