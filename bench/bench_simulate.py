"""How much does KV-aware routing gain over round-robin on fleets of 8 to 128 workers, with
and without kvstore behind them, as the offered load grows?

The fleets are simulated (:mod:`engines.simulator`): the router's own policies and cost model
over workers whose block caches, batching and speeds follow the real engine's, serving the
real routing bench's traffic (``bench/engine_routing.py``: chats, tenants' system prompts,
Zipf-popular RAG documents, one-off prompts; each worker's cache holds 14% of the shared
prefixes), sized to each load as a fraction of the simulated fleet's capacity. The speeds are
``--rates FILE`` (a JSON of rates), or with ``--calibrate`` measured from one real worker of
the routing bench's model started here (``--rates-out`` keeps them); otherwise the defaults
of :class:`engines.simulator.rates.SimRates`.

The simulator is deterministic, so there is no noise to interleave against: the baseline
(round-robin) runs on the same requests as KV-aware, and the full run takes the median over
three workload seeds. Rows: KV-aware against round-robin at each fleet size, load and kvstore
setting, on TTFT p50 (target 1.3, the issue's), goodput (1.3), prefix hit rate (1.0) and TTFT
p99 and throughput (no target). ``--plot`` draws TTFT p50 against load.

Goodput at one offered load hardly tells policies apart while the fleet keeps up (every
policy serves what arrives). So each fleet size also gets the **SLO goodput** of every policy
(:mod:`engines.simulator.capacity`, DistServe's definition): the good requests per second at
the highest load where at least 90% of the requests meet both targets, KV-aware's against
each other policy's (target 1.3).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import report, row

from engines.router.policies import POLICIES as ALL_POLICIES
from engines.simulator import plot
from engines.simulator.capacity import slo_capacity
from engines.simulator.fleet import FleetConfig
from engines.simulator.rates import SimRates
from engines.simulator.sweep import Point, run_point
from engines.simulator.traffic import default_shape, workload

POLICIES = ("kv", "round-robin")
CAPACITY_SESSIONS = 6  # per worker, at load 1 of the SLO goodput search
METRICS = (("TTFT p50", "ttft_p50", "s", False, 1.3), ("goodput", "goodput", "requests/s",
                                                        True, 1.3),
           ("prefix hit rate", "hit_rate", "fraction", True, 1.0),
           ("TTFT p99", "ttft_p99", "s", False, None),
           ("throughput", "tokens_per_s", "tokens/s", True, None))


def calibrate(rates_out: str | None) -> SimRates:
    """Rates measured from one real worker of the routing bench's model and flags, the
    request overhead through a router (a thread here, as in the routing bench)."""
    from bench_engine import make_model

    from engines.router.app import create_app as router_app
    from engines.router.core import Router
    from engines.simulator.calibrate import measure, measure_route
    from engines.simulator.traffic import targets
    from engines.testing import ThreadServer, engine_proc

    wl = workload(vocab=500)
    shape = default_shape(wl)
    mean_prompt = targets(wl, FleetConfig(shape=shape)).mean_prompt
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "model", quick=False)
        proc = engine_proc(model, args=(
            "--block-size", str(shape.block_size), "--num-blocks", str(shape.num_blocks),
            "--max-batch-tokens", str(shape.max_batch_tokens), "--kernels", "numpy"))
        proc.start()
        router = ThreadServer(router_app(Router([proc.url]))).start()
        try:
            rates = measure(proc.url, vocab=490, long=mean_prompt,
                            max_batch_tokens=shape.max_batch_tokens)
            rates = measure_route(router.url, rates, vocab=490, repeats=10)
        finally:
            router.stop()
            proc.stop()
    if rates_out:
        rates.save(rates_out)
    return rates


def median_point(points: list[Point]) -> dict[tuple[str, bool], dict[str, float]]:
    """Each (policy, kvstore)'s metrics, medians over the seeds."""
    keys = points[0].results
    return {k: {m: statistics.median(p.results[k][m] for p in points)
                for m in points[0].results[k]} for k in keys}


def capacity_rows(rates: SimRates, size: int, seeds: tuple[int, ...]) -> list[dict[str, Any]]:
    """SLO goodput of every policy at ``size`` workers (medians over ``seeds``), KV-aware's
    against each other's, with and without kvstore; :data:`CAPACITY_SESSIONS` sessions per
    worker at load 1."""
    out = []
    for store in (False, True):
        tag = ", with kvstore" if store else ""
        good: dict[str, float] = {}
        loads: dict[str, float] = {}
        for policy in ALL_POLICIES:
            caps = []
            for seed in seeds:
                wl = workload(seed=seed)
                fleet = FleetConfig(rates=rates, shape=default_shape(wl))
                caps.append(slo_capacity(wl, fleet, workers=size,
                                         sessions=CAPACITY_SESSIONS * size, policy=policy,
                                         kvstore=store))
            good[policy] = statistics.median(c.goodput for c in caps)
            loads[policy] = statistics.median(c.load for c in caps)
        for base in (p for p in ALL_POLICIES if p != "kv"):
            out.append(row(f"SLO goodput, KV-aware{tag}", "requests/s", good["kv"],
                           f"{base}{tag}", good[base], higher_is_better=True, target=1.3,
                           workers=size, load=round(loads["kv"], 3),
                           baseline_load=round(loads[base], 3)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="8, 32 and 128 workers at two loads, one seed, SLO goodput up to 32 "
                    "workers (under a minute)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the JSON report")
    ap.add_argument("--plot", default=None, metavar="PATH",
                    help="write a PNG of TTFT p50 against load")
    ap.add_argument("--rates", default=None, metavar="FILE", help="the workers' rates (JSON)")
    ap.add_argument("--calibrate", action="store_true",
                    help="measure the rates from one real worker first")
    ap.add_argument("--rates-out", default=None, metavar="PATH",
                    help="with --calibrate: write the measured rates here")
    args = ap.parse_args()

    rates = (calibrate(args.rates_out) if args.calibrate
             else SimRates.load(args.rates) if args.rates else SimRates())
    sizes = (8, 32, 128) if args.quick else (8, 16, 32, 64, 128)
    loads = (0.5, 2.0) if args.quick else (0.25, 0.5, 1.0, 2.0, 4.0)
    seeds = (0,) if args.quick else (0, 1, 2)
    per_worker = 12 if args.quick else 25
    print(f"rates: {rates.as_dict()}")
    rows: list[dict[str, Any]] = []
    plotted: list[Point] = []
    started = time.perf_counter()
    for size in sizes:
        for load in loads:
            points = []
            for seed in seeds:
                wl = workload(seed=seed)
                fleet = FleetConfig(rates=rates, shape=default_shape(wl))
                points.append(run_point(wl, fleet, workers=size, load=load,
                                        sessions=per_worker * size, policies=POLICIES))
            res = median_point(points)
            plotted.append(points[0]._replace(results=res))
            print(f"  {size:>4} workers, load {load:<4}: {points[0].requests} requests, "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
            for store in (False, True):
                tag = ", with kvstore" if store else ""
                kv, rr = res[("kv", store)], res[("round-robin", store)]
                for name, key, unit, higher, target in METRICS:
                    rows.append(row(f"{name}, KV-aware{tag}", unit, kv[key],
                                    f"round-robin{tag}", rr[key], higher_is_better=higher,
                                    target=target, workers=size, load=load))
        if size <= 32 or not args.quick:  # 128 workers' searches take minutes
            rows += capacity_rows(rates, size, seeds)
    report("simulate", rows, args.json)
    if args.plot:
        if plot.available():
            plot.ttft_against_load(plotted, args.plot)
            print(f"wrote {args.plot}")
        else:
            print("--plot: matplotlib is not installed; no PNG written")


if __name__ == "__main__":
    main()
