"""How close are the live what-if curves to the truth, what do they cost per access, and how
much memory do they hold?

Accuracy: each trace (``whatif_traces.py``: chat, RAG, shared system prompts and a two-model
mix from ``engines/workload.py``, and the eviction bench's chat, zipf and scan) is fed to a
:class:`~kvstore.whatif.WhatIfTracker` at the default sample rate, one per policy (LRU from
reuse distances, LFU and S3-FIFO by miniature simulations), with today's capacity at 5% of
the trace's distinct bytes; the baseline is an exact replay of the same trace through the real
policy class (:func:`kvstore.whatif.replay`) at every other point of the curve (half octaves
from 0.25x to 4x). The error depends on which blocks the hash sample holds, so each trace is
also fed with its hashes re-drawn (``salts``: the same reuse, other sampled blocks) and the
row gives the median and worst mean absolute error over the draws (5 draws; ``--quick``: 2,
and octaves only). Targets: 0.02 for LRU, 0.04 for the others, at the default rate
(``--quick`` feeds traces ten times shorter at ten times the rate, so that the sample holds
as many blocks; its rows have no target). A second table gives LRU with the other ways to
count the sample's deviation (``kvstore.whatif.estimate``) and at five times the rate.

Cost: ns per request of ``access_many`` on 32-block batches for unsampled blocks, for sampled
ones, and over a trace at the default rate, interleaved with the baseline of the work a tier
does for the same batch already (``LRUPolicy.on_hit_many``). Memory: tracemalloc's count after
a stream of distinct blocks, per tracked key, and the bound at 10 million distinct blocks.

Usage: bench_whatif.py [--quick] [--json PATH] [--plot PATH]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
from common import interleaved, machine, report  # bench/ is on sys.path when run as a script
from tqdm import tqdm
from whatif_traces import Trace, eviction_traces, workload_traces

from kvstore.policy.lru import LRUPolicy
from kvstore.whatif import SimCache, WhatIfConfig, WhatIfTracker, replay
from kvstore.whatif.config import DEFAULT_MAX_KEYS, DEFAULT_SAMPLE_RATE

POLICIES = ("lru", "lfu", "s3fifo")
TARGET = {"lru": 0.02, "lfu": 0.04, "s3fifo": 0.04}
BOUND_BYTES_PER_KEY = 200  # what kvstore.whatif.tracker states
DISTINCT_AT_SCALE = 10_000_000

Curves = dict[str, dict[str, dict]]  # trace -> policy -> {"caps", "exact", "estimates"}


def feed(tracker: WhatIfTracker, trace: Trace) -> None:
    access, hashes = tracker.access_many, trace.hashes
    for s in trace.spans:
        access(s.namespace, hashes[s.start:s.end], s.size)


def estimate(draws: list[Trace], current: int, policy: str, config: WhatIfConfig,
             every: int) -> tuple[list[int], list[list[float]], list[int]]:
    """Each draw's curve: the capacities kept, the hit rates at them, the sampled requests."""
    estimates, sampled = [], []
    for drawn in draws:
        tracker = WhatIfTracker("host", current, policy, config)
        feed(tracker, drawn)
        curve = tracker.curve()
        estimates.append([p.hit_rate for p in curve.points[::every]])
        sampled.append(curve.sampled)
    return [p.capacity_bytes for p in curve.points[::every]], estimates, sampled


def errors_of(estimates: list[list[float]], exact: list[float]) -> list[float]:
    return [float(np.mean(np.abs(np.subtract(e, exact)))) for e in estimates]


def lru_variants(rate: float) -> dict[str, WhatIfConfig]:
    """LRU beside the default: the other two ways to count the sample's deviation, and five
    times the rate."""
    return {"shards_adj": WhatIfConfig(sample_rate=rate, adjust="shards"),
            "no adjustment": WhatIfConfig(sample_rate=rate, adjust="none"),
            "5x rate": WhatIfConfig(sample_rate=min(1.0, 5 * rate))}


def accuracy_rows(traces: dict[str, Callable[[], Trace]], rate: float, salts: int,
                  every: int, quick: bool) -> tuple[list[dict], Curves]:
    rows: list[dict] = []
    curves: Curves = {}
    bar = tqdm(total=len(traces) * len(POLICIES), desc="accuracy", file=sys.stderr)
    for name, make in traces.items():
        trace = make()
        keys, sizes = trace.keys_and_sizes()
        current = trace.current()
        draws = [trace.resalted(s) for s in range(salts)]
        common = {"trace": name, "accesses": len(keys), "distinct": len(set(keys)),
                  "current_bytes": current, "draws": salts, "unit": "mean abs error"}
        for policy in POLICIES:
            caps, estimates, sampled = estimate(draws, current, policy,
                                                WhatIfConfig(sample_rate=rate), every)
            exact = [sum(replay(policy, keys, sizes, c)) / len(keys) for c in caps]
            errors = errors_of(estimates, exact)
            curves.setdefault(name, {})[policy] = {"caps": caps, "exact": exact,
                                                   "estimates": estimates,
                                                   "current": current}
            value = statistics.median(errors)
            target = None if quick else TARGET[policy]
            rows.append({
                "case": f"{name} {policy}", **common, "policy": policy,
                "method": "shards" if policy == "lru" else "mini", "sample_rate": rate,
                "sampled_median": int(statistics.median(sampled)), "value": round(value, 4),
                "worst": round(max(errors), 4),
                "baseline": f"exact {policy} replay", "baseline_value": None, "ratio": None,
                "target": target, "meets_target": None if target is None else value <= target,
                "points": [{"capacity_bytes": c, "exact": round(x, 4),
                            "estimated": [round(e[i], 4) for e in estimates]}
                           for i, (c, x) in enumerate(zip(caps, exact, strict=True))],
            })
            if policy == "lru":
                for label, config in lru_variants(rate).items():
                    errors = errors_of(estimate(draws, current, policy, config, every)[1],
                                       exact)
                    rows.append({
                        "case": f"{name} lru {label}", **common, "policy": policy,
                        "variant": label, "sample_rate": config.sample_rate,
                        "adjust": config.adjust,
                        "value": round(statistics.median(errors), 4),
                        "worst": round(max(errors), 4), "baseline": "exact lru replay",
                        "baseline_value": None, "ratio": None, "target": None,
                        "meets_target": None})
            bar.update()
    bar.close()
    return rows, curves


def cost_rows(reps: int) -> list[dict]:
    """ns per block request, 32-block batches, each case interleaved with an LRU policy's
    ``on_hit_many`` on a batch of the same size (the bookkeeping a tier does anyway)."""
    rng = np.random.default_rng(7)
    blocks = 20_000
    raw = rng.bytes(32 * blocks)
    pool = [raw[i * 32:(i + 1) * 32] for i in range(blocks)]
    limit = round(DEFAULT_SAMPLE_RATE * 2**64).to_bytes(8, "big")
    unsampled = [h for h in pool if h >= limit]
    ids = rng.zipf(1.3, 200_000) % blocks
    stream = [pool[i] for i in ids]
    size = 2 << 20

    def batches(hashes: list[bytes]) -> list[list[bytes]]:
        return [hashes[i:i + 32] for i in range(0, len(hashes) - 31, 32)]

    def run(tracker: WhatIfTracker, work: list[list[bytes]]) -> Callable[[], None]:
        def go() -> None:
            for b in work:
                tracker.access_many("ns", b, size)
        return go

    policy = LRUPolicy()
    for h in pool:
        policy.on_put(("ns", h), size)

    def baseline(work: list[list[bytes]]) -> Callable[[], None]:
        """The same batches, as store keys, through the resident LRU's ``on_hit_many``."""
        keyed = [[("ns", h) for h in b] for b in work]

        def go() -> None:
            for b in keyed:
                policy.on_hit_many(b)
        return go

    current = 2_000 * size
    cases = [
        ("unsampled block", WhatIfTracker("host", current), batches(unsampled)),
        ("sampled block, lru", WhatIfTracker("host", current, config=WhatIfConfig(
            sample_rate=1.0)), batches(stream[:20_000])),
        ("sampled block, s3fifo mini", WhatIfTracker("host", current, "s3fifo", WhatIfConfig(
            sample_rate=1.0)), batches(stream[:5_000])),
        ("trace at 1%, lru", WhatIfTracker("host", current), batches(stream)),
        ("trace at 1%, s3fifo mini", WhatIfTracker("host", current, "s3fifo"), batches(stream)),
    ]
    rows = []
    for label, tracker, work in tqdm(cases, desc="cost", file=sys.stderr):
        n = 32 * len(work)
        mine, base = interleaved([run(tracker, work), baseline(work)], reps, warmup=1)
        value, base_ns = mine / n * 1e9, base / n * 1e9
        rows.append({"case": f"tracker {label}", "unit": "ns/access", "value": round(value, 1),
                     "baseline": "LRUPolicy.on_hit_many", "baseline_value": round(base_ns, 1),
                     "ratio": round(base_ns / value, 3), "target": None, "meets_target": None})
    return rows


def _measured(make: Callable[[], object]) -> tuple[object, int]:
    gc.collect()
    tracemalloc.start()
    obj = make()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return obj, used


def memory_rows(distinct: int) -> list[dict]:
    """Bytes per tracked key measured over ``distinct`` distinct blocks, the same with a
    bound far below them (fixed-size), and the bound at ten million distinct blocks."""
    rng = np.random.default_rng(11)
    raw = rng.bytes(32 * distinct)
    hashes = [raw[i * 32:(i + 1) * 32] for i in range(distinct)]
    size = 2 << 20

    def stream(config: WhatIfConfig) -> Callable[[], WhatIfTracker]:
        def make() -> WhatIfTracker:
            t = WhatIfTracker("host", 50_000 * size, config=config)
            for i in range(0, distinct, 32):
                t.access_many("ns", hashes[i:i + 32], size)
            return t
        return make

    rows: list[dict] = []
    for label, config in (("rate 1, no bound", WhatIfConfig(sample_rate=1.0, max_keys=None)),
                          ("rate 1, bound 16,384 keys",
                           WhatIfConfig(sample_rate=1.0, max_keys=16_384))):
        tracker, used = _measured(stream(config))
        assert isinstance(tracker, WhatIfTracker)
        keys = tracker.tracked_keys
        rows.append({"case": f"memory per key, {label}", "distinct": distinct,
                     "tracked_keys": keys, "unit": "B/key", "value": round(used / keys, 1),
                     "baseline": "stated bound", "baseline_value": BOUND_BYTES_PER_KEY,
                     "ratio": round(BOUND_BYTES_PER_KEY / (used / keys), 3), "target": 1.0,
                     "meets_target": used / keys <= BOUND_BYTES_PER_KEY})
    per_mini_key = {}
    for policy in POLICIES:
        _, used = _measured(_filler(policy, 50_000))
        per_mini_key[policy] = used / 50_000
        rows.append({"case": f"memory per mini-cache key, {policy}", "unit": "B/key",
                     "value": round(used / 50_000, 1), "baseline": None, "baseline_value": None,
                     "ratio": None, "target": None, "meets_target": None})
    # at ten million distinct blocks the default rate tracks 100,000 keys (under the bound);
    # the miniature caches depend on the tier: a 64 GiB host tier of 2 MiB blocks as example
    keys_at_scale = min(DEFAULT_MAX_KEYS, round(DISTINCT_AT_SCALE * DEFAULT_SAMPLE_RATE))
    per_key = max(r["value"] for r in rows[:2])
    grid = WhatIfConfig().capacities(32_768)
    mini_keys = sum(round(c * DEFAULT_SAMPLE_RATE) for c in grid)
    rows.append({"case": "tracker at 10M distinct blocks (default config)",
                 "tracked_keys": keys_at_scale, "unit": "MB",
                 "value": round(keys_at_scale * per_key / 1e6, 1),
                 "baseline": "stated bound",
                 "baseline_value": round(keys_at_scale * BOUND_BYTES_PER_KEY / 1e6, 1),
                 "ratio": None, "target": None, "meets_target": None,
                 "bound_any_distinct_mb": round(DEFAULT_MAX_KEYS * BOUND_BYTES_PER_KEY / 1e6, 1),
                 "mini_caches_mb_64gib_host": round(
                     mini_keys * max(per_mini_key.values()) / 1e6, 1)})
    return rows


def _filler(policy: str, n: int) -> Callable[[], SimCache]:
    return lambda: _filled(policy, n)


def _filled(policy: str, n: int) -> SimCache:
    cache = SimCache(policy, n)
    for i in range(n):
        cache.read((i * 0x9E3779B97F4A7C15) & ((1 << 64) - 1), 1)
    return cache


def print_accuracy(rows: list[dict]) -> None:
    main = [r for r in rows if "variant" not in r]
    print(f"{'trace':<11} {'accesses':>9} {'distinct':>9} {'current':>9} {'rate':>6}"
          + "".join(f" {p:>25}" for p in POLICIES))
    by = {(r["trace"], r["policy"]): r for r in main}
    names = list(dict.fromkeys(r["trace"] for r in main))
    for name in names:
        first = by[(name, POLICIES[0])]
        cells = []
        for p in POLICIES:
            r = by[(name, p)]
            mark = "" if r["target"] is None else (" ok" if r["meets_target"] else " MISS")
            cells.append(f"{r['value']:.4f} (worst {r['worst']:.3f}){mark}")
        print(f"{name:<11} {first['accesses']:>9} {first['distinct']:>9} "
              f"{first['current_bytes'] / 2**30:>7.1f}Gi {first['sample_rate']:>6.2f}"
              + "".join(f" {c:>25}" for c in cells))
    print("cells: median mean absolute error of the curve against the exact replay, over the "
          "hash draws (worst draw); targets lru 0.02, others 0.04")
    variants = {(r["trace"], r["variant"]): r for r in rows if "variant" in r}
    labels = list(dict.fromkeys(v for _, v in variants))
    print(f"\nLRU, other estimates:\n{'trace':<11} {'default':>15}"
          + "".join(f" {v:>15}" for v in labels))
    for name in names:
        cells = [f"{by[(name, 'lru')]['value']:.4f} ({by[(name, 'lru')]['worst']:.3f})"] + [
            f"{variants[(name, v)]['value']:.4f} ({variants[(name, v)]['worst']:.3f})"
            for v in labels]
        print(f"{name:<11}" + "".join(f" {c:>15}" for c in cells))


def plot(curves: Curves, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(curves)
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for i, (policy, c) in enumerate(curves[name].items()):
            color = f"C{i}"
            x = [cap / c["current"] for cap in c["caps"]]
            ax.plot(x, c["exact"], "-", color=color, label=f"{policy} exact")
            ax.plot(x, c["estimates"][0], "o", color=color, ms=4,
                    label=f"{policy} {'shards' if policy == 'lru' else 'mini'}")
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks([0.25, 0.5, 1, 2, 4], ["1/4", "1/2", "1", "2", "4"])
        ax.set_title(f"{name} (today {curves[name][POLICIES[0]]['current'] / 2**30:.1f} GiB)",
                     fontsize=9)
        ax.set_xlabel("capacity / today's")
        ax.set_ylabel("hit rate")
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="traces 10x shorter at 10x the sample rate, 2 draws (<2 min)")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of curves vs exact replay")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.quick:
        scale, length, rate, salts, every, reps, distinct = 0.1, 100_000, 0.1, 2, 4, 3, 20_000
    else:
        scale, length, rate, salts, every, reps, distinct = 1.0, 1_000_000, \
            DEFAULT_SAMPLE_RATE, 5, 2, 5, 200_000
    traces = {**workload_traces(scale), **eviction_traces(length)}
    acc, curves = accuracy_rows(traces, rate, salts, every, args.quick)
    rows = acc + cost_rows(reps) + memory_rows(distinct)
    print_accuracy(acc)
    print()
    report("whatif", rows[len(acc):], None)
    if args.json:
        import json
        from pathlib import Path

        doc = {"bench": "whatif", "machine": machine("numpy"), "rows": rows,
               "seconds": round(time.perf_counter() - start, 1)}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot(curves, args.plot)


if __name__ == "__main__":
    main()
