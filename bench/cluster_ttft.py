"""Cross-node hits for ``bench_cluster.py``: the time to first token of a fresh engine (the
built-in one and real vLLM) whose long prefix is on its own node, only on a peer node of its
cluster, only in S3, or nowhere.

- **own**: on the engine's own node;
- **peer**: only on another node of its cluster (its node finds it through Redis and reads it
  from the peer);
- **S3**: only in S3 (its node, with an S3 tier on SeaweedFS and no cluster, holds it in none
  of its tiers above S3: another node wrote it there);
- **recompute**: nowhere (an engine without kvstore computes it).

Nodes, all ``kvstore serve`` on loopback: ``a`` and ``b`` in a cluster over one
``redis-server``; ``w`` and ``r`` alone, on one S3 bucket. Engines (:mod:`ttft_engines`, one
process each, started once; each prompt is served as by a fresh engine, its own prefix cache
reset): on ``a`` (own), on ``b`` (peer), on ``r`` (S3), on ``w`` (writes to S3), and one
without kvstore (recompute), for the built-in engine and for real vLLM (CPU build,
``KVStoreConnector``).

Each repetition takes a new prefix. The engines on ``a`` and ``w`` compute it (at once, not
timed); ``w`` is then filled with other blocks until its memory has demoted the prefix to S3,
and its uploads are waited for. Then the four cases run in turn, each on the prefix plus the
same new question; every case's loaded tokens are checked (the whole prefix, or none), and
``b`` and ``r`` must have read it from ``a`` and from S3. A first round on a short prefix
warms every path and is not counted; rows are medians over repetitions.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import row
from bench.ttft_engines import BUILTIN_BLOCK, Answer, EngineProc
from kvstore.client import KVStoreClient
from kvstore.protocol.cluster import ClusterStatus, NodeState
from kvstore.testing.redis_server import RedisServer
from kvstore.testing.seaweed import SeaweedServer
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash

PEER_VS_RECOMPUTE = 5.0  # target: TTFT with the prefix on a peer, against recomputing it
PEER_VS_S3 = 3.0  # target: the same against reading it from S3
CASES = {"own": "prefix on its own node", "peer": "prefix on a peer", "s3": "S3 only",
         "recompute": "recompute"}
WARMUP_TOKENS = 256  # the uncounted first round
QUESTION_TOKENS = 8  # under a block: only the prefix's blocks are stored and loaded
WRITER_HOST_MIB = 32  # the S3 writer's memory: the filler pushes a prefix out of it
FILLER_BLOCK = 1 << 20  # bytes
FILLER_BYTES = bytes(range(256)) * (FILLER_BLOCK // 256)
Samples = dict[str, list[Answer]]


@dataclass(frozen=True, slots=True)
class Sizes:
    """Prefix length, repetitions and model sizes of one run."""

    prefix_tokens: int
    reps: int
    vllm_layers: int

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        # 2k tokens: a second of prefill for the built-in model, several for vLLM's on 2 cores
        return cls(2048, 3, 4) if quick else cls(4096, 7, 4)


class Fleet:
    """The four nodes and what they stand on (Redis, SeaweedFS)."""

    def __init__(self, root: Path) -> None:
        self.redis = RedisServer(root / "redis")
        self.s3 = SeaweedServer(root / "weed", "benchkey", os.urandom(12).hex())
        self.nodes: tuple[ServerProc, ...] = ()
        self._filler: KVStoreClient | None = None
        try:
            self._start(root)
        except BaseException:
            self.stop()
            raise

    def _start(self, root: Path) -> None:
        self.redis.start()
        self.s3.start()
        cluster = ["--cluster", self.redis.url, "--cluster-heartbeat-s", "0.2"]
        s3_flags, env = self.s3.serve_args()
        self.a = ServerProc(root / "a", *cluster, "--node-id", "a", host_capacity="1GiB")
        self.b = ServerProc(root / "b", *cluster, "--node-id", "b", host_capacity="1GiB")
        self.w = ServerProc(root / "w", *s3_flags, env=env, host_capacity=f"{WRITER_HOST_MIB}MiB",
                            disk_capacity="0")  # its memory is one small tier
        self.r = ServerProc(root / "r", *s3_flags, env=env, host_capacity="1GiB")
        self.nodes = (self.a, self.b, self.w, self.r)
        for node in self.nodes:
            node.start()
        _wait(lambda: [n.state for n in self.cluster(self.a).nodes] == [NodeState.UP] * 2)
        self._filler = KVStoreClient(self.w.url)
        self._filler.register_namespace("filler", FILLER_BLOCK, {"model_id": "filler"})

    @staticmethod
    def cluster(node: ServerProc) -> ClusterStatus:
        doc = httpx.get(node.url + "/v1/cluster", timeout=10).json()
        return ClusterStatus.model_validate(doc)

    def reads(self) -> tuple[int, int]:
        """Blocks read so far by ``b`` from its peers and by ``r`` from S3."""
        with KVStoreClient(self.r.url) as r:
            s3 = (r.stats().tiers["s3"].backend or {}).get("hits", 0)
        return self.cluster(self.b).fetched.blocks, int(s3)

    def push_writer_to_s3(self) -> None:
        """Fill ``w`` past its memory so that what it held is demoted to S3; wait until its
        uploads are done."""
        filler = self._filler
        assert filler is not None
        n = (WRITER_HOST_MIB << 20) // FILLER_BLOCK + 8
        filler.put("filler", [BlockHash(os.urandom(32)) for _ in range(n)], [FILLER_BYTES] * n)

        def uploaded() -> bool:
            backend = filler.stats().tiers["s3"].backend or {}
            return backend.get("pending") == 0
        _wait(uploaded, 120)

    def stop(self) -> None:
        if self._filler is not None:
            self._filler.close()
        for node in self.nodes:
            node.stop()
        self.s3.stop()
        self.redis.stop()


def _wait(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("the nodes did not settle")
        time.sleep(0.1)


# -- the engines -------------------------------------------------------------------------------

def builtin_model(out: Path) -> Path:
    """A random Llama, 4 layers of 512 (8 heads over 2 KV heads): a 2k-token prefill is a
    second of one core's work."""
    from engines.tiny_model import llama_config, write_checkpoint

    cfg = llama_config(vocab=512, kv_heads=2, max_position_embeddings=8192, hidden=512,
                       intermediate=1376, layers=4, heads=8)
    return write_checkpoint(out, cfg, seed=0)


def engine_specs(kind: str, model: Path, fleet: Fleet, longest: int) -> dict[str, dict[str, Any]]:
    """One spec per engine: the four cases' and the S3 writer's."""
    nodes = {"own": fleet.a.url, "peer": fleet.b.url, "s3": fleet.r.url, "writer": fleet.w.url,
             "recompute": None}
    if kind == "builtin":
        return {name: {"engine": "builtin", "model": str(model), "kvstore": url,
                       "max_prompt": longest} for name, url in nodes.items()}
    return {name: {"engine": "vllm", "model": str(model), "connector": None if url is None else {
        "kv_connector": "KVStoreConnector", "kv_connector_module_path": "connectors.vllm",
        "kv_role": "kv_both", "kv_connector_extra_config": {"kvstore_url": url}}}
        for name, url in nodes.items()}


def one_round(engines: dict[str, EngineProc], fleet: Fleet, block: int, prefix: list[int],
              question: list[int], populate: list[int]) -> dict[str, Answer]:
    """Store ``prefix`` on ``a`` and in S3, then serve ``prefix + question`` in every case;
    raises if a case loaded other than the whole prefix (none for recomputing), or if ``b``
    and ``r`` did not read it from ``a`` and from S3."""
    engines["own"].send(prefix + populate)  # neither is timed: computed side by side
    engines["writer"].send(prefix + populate)
    engines["own"].answer()
    engines["writer"].answer()
    time.sleep(1.0)  # saves after the first token land; the index lags a node by 0.1 s + RTT
    fleet.push_writer_to_s3()
    before = fleet.reads()
    got = {case: engines[case].run(prefix + question) for case in CASES}
    peer, s3 = (n - b for n, b in zip(fleet.reads(), before, strict=True))
    want = {"own": len(prefix), "peer": len(prefix), "s3": len(prefix), "recompute": 0}
    wrong = {c: (a.cached, want[c]) for c, a in got.items() if a.cached != want[c]}
    if wrong:
        raise RuntimeError(f"prompt tokens loaded (got, expected) per case: {wrong}")
    if min(peer, s3) < len(prefix) // block:
        raise RuntimeError(f"{len(prefix) // block} blocks wanted; b read {peer} from a peer, "
                           f"r {s3} from S3")
    return got


def measure(kind: str, model: Path, fleet: Fleet, sizes: Sizes, logs: Path,
            vocab: tuple[int, int], block: int) -> Samples:
    """Every case's answers on one engine kind, one per counted round."""
    longest = sizes.prefix_tokens + QUESTION_TOKENS
    specs = engine_specs(kind, model, fleet, longest)
    engines = {name: EngineProc(spec, logs / f"{kind}-{name}.log")
               for name, spec in specs.items()}
    rng = random.Random(kind)
    samples: Samples = {case: [] for case in CASES}
    try:
        for engine in engines.values():
            engine.wait_ready()

        def tokens(n: int) -> list[int]:
            return [rng.randrange(*vocab) for _ in range(n)]
        for rep in range(sizes.reps + 1):
            n = WARMUP_TOKENS if rep == 0 else sizes.prefix_tokens
            got = one_round(engines, fleet, block, tokens(n), tokens(QUESTION_TOKENS),
                            tokens(QUESTION_TOKENS))
            print(f"  {kind} round {rep}/{sizes.reps}: " + ", ".join(
                f"{c} {a.seconds:.3f}s" for c, a in got.items()), flush=True)
            if rep:
                for case, answer in got.items():
                    samples[case].append(answer)
    finally:
        for engine in engines.values():
            engine.close()
    return samples


def rows_of(kind: str, samples: Samples, prefix_tokens: int, block: int) -> list[dict[str, Any]]:
    """The ratio rows of one engine kind (bench/common.py): the peer case against recomputing and
    against S3 (with targets), against its own node (stated), and own and S3 against
    recomputing."""
    med = {c: statistics.median(a.seconds for a in samples[c]) for c in CASES}
    extra = {"engine": kind, "prefix_tokens": prefix_tokens, "block_tokens": block,
             "reps": len(samples["own"])}

    def one(case: str, base: str, target: float | None = None) -> dict[str, Any]:
        return row(f"TTFT {kind}, {CASES[case]}", "s", med[case], CASES[base], med[base],
                   higher_is_better=False, target=target, **extra)
    return [one("peer", "recompute", PEER_VS_RECOMPUTE), one("peer", "s3", PEER_VS_S3),
            one("peer", "own"), one("own", "recompute"), one("s3", "recompute")]


def cross_node_ttft(quick: bool, vllm: bool = True) -> list[dict[str, Any]]:
    """The cross-node hit rows for the built-in engine and (unless ``vllm`` is False) vLLM.
    Everything it writes (checkpoints, the nodes' data, logs) is removed after, or kept and
    named when it fails."""
    sizes = Sizes.of(quick)
    tmp = Path(tempfile.mkdtemp(prefix="kvcluster-ttft-"))
    rows: list[dict[str, Any]] = []
    try:
        fleet = Fleet(tmp)
        try:
            for kind in ["builtin", "vllm"] if vllm else ["builtin"]:
                print(f"TTFT of a {sizes.prefix_tokens}-token prefix, {kind} engine...",
                      flush=True)
                if kind == "builtin":
                    model, vocab, block = builtin_model(tmp / kind), (0, 512), BUILTIN_BLOCK
                else:
                    from bench.bench_vllm import BLOCK, build_checkpoint

                    model, vocab, block = tmp / kind, (100, 31000), BLOCK
                    build_checkpoint(model, sizes.vllm_layers)
                samples = measure(kind, model, fleet, sizes, tmp, vocab, block)
                rows += rows_of(kind, samples, sizes.prefix_tokens, block)
        finally:
            fleet.stop()
    except BaseException:
        print(f"cross-node TTFT failed: logs in {tmp}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Bars of each engine's four TTFTs (log scale: recomputing is tens of times slower)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds: dict[str, dict[str, float]] = {}
    for r in rows:
        if "engine" in r:
            per = seconds.setdefault(r["engine"], {})
            per[r["case"].split(", ", 1)[1]] = r["value"]
            per[r["baseline"]] = r["baseline_value"]
    labels = list(CASES.values())
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, label in enumerate(labels):
        xs = [k + (i - (len(labels) - 1) / 2) * width for k in range(len(seconds))]
        ax.bar(xs, [per[label] for per in seconds.values()], width, label=label)
    ax.set_xticks(range(len(seconds)), [f"{k} engine" for k in seconds])
    ax.set_yscale("log")
    ax.set_ylabel("time to first token, s")
    ax.set_title(f"fresh engine, {rows[0]['prefix_tokens']}-token prefix" if rows else "")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
