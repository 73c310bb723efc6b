"""The model of ``bench/cluster_scale.py``: what a fleet of N nodes asks of Redis at a
per-node load, from the costs measured on a real Redis (``IndexCost``, ``MemberCost``).

Per N: index entries and Redis memory, index calls/s (one script call per index change, as a
node's flush touches that many buckets; one ``HMGET`` per index read), heartbeat calls and
their replies (a node beats every period and lists every node every ``ceil(N / LIST_FANOUT)``
beats, reading their reports at one listing in ``REPORTS_EVERY``), the CPU share of one Redis
command thread for each, the index's staleness (publish period, a round trip and the flush's
calls served by the busiest master, stretched by 1 / (1 - load) as an M/M/1 queue would) and
the masters a Redis Cluster needs: the index shards over masters, membership lives under one
hash tag, on one master, and does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from kvstore.cluster.members import REPORTS_EVERY
from kvstore.cluster.node import LIST_FANOUT


@dataclass(frozen=True, slots=True)
class Load:
    """Per-node load of the modelled fleet, and what one Redis server may take. One node is
    one ``kvstore serve`` beside an 8-GPU server serving a Llama-3-8B-sized model: 16-token
    blocks of 2 MiB (128 KiB of KV per token in fp16). ``cluster_index_bits`` is set as the
    docs advise (near log2(blocks per namespace / 64)), so that buckets stay compact as
    measured; the default 16 suits ~4M blocks, about four such nodes."""

    blocks_per_node: int = 1 << 20  # blocks a node's tiers hold: 256 GiB host + 1.75 TiB disk
    holders: float = 1.5  # mean nodes holding a listed block (peer reads keep copies)
    prompt_tokens_s: float = 64_000.0  # prompt tokens a node's engines take per second
    computed_share: float = 0.5  # of those, computed (not hit): each new block is put
    changes_per_put: float = 3.0  # index changes in a block's life: put, host->disk, eviction
    reads_per_prompt_block: float = 0.3  # index HMGETs per prompt block (fleet run: ~0.3)
    block_tokens: int = 16
    heartbeat_s: float = 1.0  # the default
    publish_s: float = 0.1  # the default: the index's staleness bound while Redis keeps up
    rtt_s: float = 0.0005  # node <-> Redis round trip in a data centre
    redis_memory: int = 32 << 30  # bytes one Redis server may use for the cluster
    redis_cpu: float = 0.7  # share of its one command thread a server may be kept busy

    @property
    def changes_s(self) -> float:
        """Index changes per node per second."""
        return self.prompt_tokens_s * self.computed_share / self.block_tokens * \
            self.changes_per_put

    @property
    def reads_s(self) -> float:
        """Index reads (HMGET) per node per second."""
        return self.prompt_tokens_s / self.block_tokens * self.reads_per_prompt_block


class IndexCost(NamedTuple):
    """The block index on one Redis deployment, as measured."""

    bytes_1: float  # Redis memory per entry, 1 holder
    bytes_3: float  # per entry, 3 holders
    publish_us: float  # main-thread CPU per publish script call (all masters)
    lookup_us: float  # per HMGET
    publish_sent_s: float  # script calls/s one Python client sent, pipelined
    lookup_sent_s: float  # HMGET/s
    calls_per_publish: float  # script calls per batch of changes (cluster_scale's batch)
    calls_per_lookup: float  # HMGET per lookup of a batch of blocks
    round_trips: float  # pipelines (shards) per batch


class MemberCost(NamedTuple):
    """One heartbeat (beat + list): CPU ``base_us + per_node_us * nodes`` (the listings mixed
    as a node makes them: reports read at one in ``REPORTS_EVERY``); a report's bytes."""

    base_us: float
    per_node_us: float
    report_bytes: int

    def listed_bytes(self) -> float:
        """Reply bytes per node listed, averaged over the listings (id, beat and slot: ~40)."""
        return 40 + self.report_bytes / REPORTS_EVERY


def list_every(n: int) -> int:
    """Beats between a node's listings in a fleet of ``n`` (``kvstore.cluster.node``)."""
    return max(1, -(-n // LIST_FANOUT))


class Scale(NamedTuple):
    """The model at one fleet size."""

    nodes: int
    entries: float
    memory_gib: float
    index_calls_s: float
    beat_calls_s: float
    roster_mb_s: float  # listing replies (every node lists every node, now and then)
    cpu_index: float  # share of one Redis command thread (> 1: one server cannot serve it)
    cpu_beats: float  # membership: on one master whatever the cluster's size
    staleness_ms: float  # with one server (inf: saturated)
    masters: int  # Redis Cluster masters needed (0: the heartbeats alone overload one)
    staleness_masters_ms: float  # with that many masters

    def fits_one(self, load: Load) -> bool:
        """Whether one Redis server carries it (CPU and memory within ``load``'s limits)."""
        return self.cpu_index + self.cpu_beats <= load.redis_cpu and \
            self.memory_gib * (1 << 30) <= load.redis_memory


def model(n: int, load: Load, one: IndexCost, sharded: IndexCost, mem: MemberCost) -> Scale:
    """Redis at ``n`` nodes, on one server (``one``'s costs) and on as many Redis Cluster
    masters as it takes (``sharded``'s costs); see the module docstring."""
    entries = n * load.blocks_per_node / load.holders
    memory = [entries * (c.bytes_1 + (load.holders - 1) * (c.bytes_3 - c.bytes_1) / 2)
              + n * mem.report_bytes for c in (one, sharded)]
    publish, reads = n * load.changes_s, n * load.reads_s
    cpu = [(publish * c.publish_us + reads * c.lookup_us) / 1e6 for c in (one, sharded)]
    beats = n / load.heartbeat_s * (mem.base_us + mem.per_node_us * n / list_every(n)) / 1e6
    masters, shards = (0, 0) if beats >= load.redis_cpu else \
        index_masters(load, cpu[1], memory[1], beats)
    beat_calls = n / load.heartbeat_s * (1 + 1 / list_every(n))  # beats and listings
    return Scale(n, entries, memory[0] / (1 << 30), publish + reads, beat_calls,
                 n * n * mem.listed_bytes() / list_every(n) / load.heartbeat_s / 1e6,
                 cpu[0], beats,
                 staleness_ms(load, one, cpu[0], beats, 1, True),
                 masters, staleness_ms(load, sharded, cpu[1], beats, shards, masters == shards))


def index_masters(load: Load, cpu: float, memory: float, beats: float) -> tuple[int, int]:
    """Masters a Redis Cluster needs, and how many of them hold index buckets: enough for the
    index's CPU and memory, membership on one of them; or, where membership would leave that
    one too little room, one more master that holds the membership keys' hash slot alone (a
    Redis Cluster assigns hash slots to masters as told)."""
    shards = max(1, math.ceil(cpu / load.redis_cpu), math.ceil(memory / load.redis_memory))
    return (shards, shards) if cpu / shards + beats <= load.redis_cpu else (shards + 1, shards)


def staleness_ms(load: Load, cost: IndexCost, cpu_index: float, cpu_beats: float,
                 shards: int, shared: bool) -> float:
    """How old the index may be: a node's publish period, a round trip and its flush's
    script calls (spread over the ``shards`` masters holding index buckets) served by the
    busiest master (one that holds membership too, if ``shared``), stretched by 1 / (1 -
    load) as an M/M/1 queue would; inf where the master is saturated."""
    if shards == 0:
        return math.inf
    busy = cpu_index / shards + (cpu_beats if shared else 0.0)
    if busy >= 1:
        return math.inf
    flush = load.changes_s * load.publish_s / shards * cost.publish_us / 1e6
    return (load.publish_s + load.rtt_s + flush / (1 - busy)) * 1e3


def largest(fits: Callable[[int], bool]) -> int:
    """The largest fleet size for which ``fits`` holds (it holds for every smaller one)."""
    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def model_table(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The model as printable rows (units in the column names)."""
    return [{"nodes": s["nodes"], "index entries (M)": s["entries"] / 1e6,
             "Redis memory (GiB)": s["memory_gib"], "index calls/s": s["index_calls_s"],
             "beat calls/s": s["beat_calls_s"], "beat replies (MB/s)": s["roster_mb_s"],
             "CPU index": s["cpu_index"], "CPU beats": s["cpu_beats"],
             "staleness 1 Redis (ms)": _or(s["staleness_ms"], "saturated"),
             "masters": s["masters"] or "none (beats)",
             "staleness masters (ms)": _or(s["staleness_masters_ms"], "saturated")}
            for s in details["model"]]


def _or(value: float | None, instead: str) -> float | str:
    return instead if value is None else value


def plot_scale(table: Sequence[Scale], load: Load, idx: IndexCost, path: str) -> None:
    """Redis calls/s, CPU and memory against N, with what one server takes drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [s.nodes for s in table]
    mix = (load.changes_s * idx.publish_us + load.reads_s * idx.lookup_us) / \
        (load.changes_s + load.reads_s)  # CPU per index call at this load's mix
    fig, (ops, cpu, mem) = plt.subplots(1, 3, figsize=(14, 4))
    ops.plot(nodes, [s.index_calls_s + s.beat_calls_s for s in table], "o-",
             label="Redis calls/s")
    ops.axhline(load.redis_cpu * 1e6 / mix, color="red", ls="--",
                label=f"one server at {load.redis_cpu:.0%} CPU (index calls)")
    cpu.plot(nodes, [s.cpu_index for s in table], "o-", label="index (shards)")
    cpu.plot(nodes, [s.cpu_beats for s in table], "s-", label="heartbeats (one master)")
    cpu.axhline(load.redis_cpu, color="red", ls="--", label="one server's limit")
    mem.plot(nodes, [s.memory_gib for s in table], "o-", label="index memory")
    mem.axhline(load.redis_memory / (1 << 30), color="red", ls="--", label="one server")
    for ax, unit in ((ops, "calls/s"), (cpu, "Redis command thread (cores)"), (mem, "GiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    fig.suptitle("kvstore cluster: what Redis carries (model from costs measured this run)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
