"""``kvstore-router simulate``: the routing policies on simulated fleets of any size (see
:mod:`engines.simulator`). Prints one table per fleet size and load; ``--json`` writes every
number, ``--plot`` TTFT p50 against load. Bad input is one line and exit code 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.router.policies import POLICIES
from kvstore import cli_kit
from kvstore.cli_kit import CommandError

if TYPE_CHECKING:
    from engines.simulator.fleet import FleetConfig
    from engines.workload import WorkloadConfig

PROG = "kvstore-router simulate"
STORES = {"off": (False,), "on": (True,), "both": (False, True)}


def _numbers(text: str, kind: type[int] | type[float], what: str, ok: str,
             positive: Callable[[float], bool]) -> list[Any]:
    """``text`` as a comma-separated list of ``kind``, each passing ``positive``."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of {what}: {text!r}") from None
    if not values or not all(positive(v) for v in values):
        raise argparse.ArgumentTypeError(f"need {ok}: {text!r}")
    return values


def _ints(text: str) -> list[int]:
    return _numbers(text, int, "integers", "integers >= 1", lambda v: v >= 1)


def _floats(text: str) -> list[float]:
    return _numbers(text, float, "numbers", "numbers > 0", lambda v: v > 0)


def _policies(text: str) -> list[str]:
    if text.strip() == "all":
        return list(POLICIES)
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown policy {bad[0] if bad else text!r}; "
                                         f"known: {','.join(POLICIES)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    from engines.simulator.traffic import OUTPUT_SCALE, SCALE

    p = cli_kit.Parser(prog=PROG, description="Simulate the router's policies (the real "
                       "policy and cost code) on fleets of simulated workers serving the "
                       "routing bench's traffic (engines/workload.py), with and without "
                       "kvstore behind them. Per fleet size and load: TTFT p50/p99, ITL p50, "
                       "throughput, prefix hit rate and goodput of each policy.")
    p.add_argument("--workers", type=_ints, default="8", metavar="N[,N...]",
                   help="fleet sizes to simulate, comma-separated")
    p.add_argument("--loads", type=_floats, default="0.5", metavar="X[,X...]",
                   help="offered loads, as fractions of the fleet's capacity (at the "
                        "traffic's reuse bound), comma-separated")
    p.add_argument("--policies", type=_policies, default="all", metavar="NAMES",
                   help=f"routing policies, comma-separated, or all ({', '.join(POLICIES)})")
    p.add_argument("--kvstore", choices=tuple(STORES), default="both",
                   help="kvstore behind the workers: off, on, or both (each policy twice)")
    p.add_argument("--store-blocks", type=int, default=None, metavar="N",
                   help="kvstore's capacity in blocks, least recently used evicted "
                        "(default: unbounded)")
    p.add_argument("--rates", default=None, metavar="FILE",
                   help="JSON of prefill_tokens_per_s, decode_tokens_per_s, "
                        "load_tokens_per_s, step_overhead_s, request_overhead_s, as "
                        "bench/bench_simulate.py --rates-out writes from real workers "
                        "(default: 11000, 3700, 80000 tokens/s, 0.0025 and 0.012 s, "
                        "measured on a 2-core CPU with the routing bench's model)")
    p.add_argument("--sessions-per-worker", type=int, default=25, metavar="N",
                   help="sessions of traffic per simulated worker")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed")
    p.add_argument("--scale", type=float, default=SCALE,
                   help="prompt lengths, as a fraction of the full-size workload (the real "
                        "routing bench's 1/4)")
    p.add_argument("--output-scale", type=float, default=OUTPUT_SCALE,
                   help="output lengths, as a fraction of the full-size workload (the real "
                        "routing bench's 1/16: a decode token costs a step on its CPU "
                        "model)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--num-blocks", type=int, default=None, metavar="N",
                   help="each worker's cache in blocks (default: 14%% of the traffic's "
                        "shared prefixes, as the real routing bench)")
    p.add_argument("--max-batch-tokens", type=int, default=256,
                   help="a worker's prefill chunk budget per step")
    p.add_argument("--max-seqs", type=int, default=32, help="a worker's batch limit")
    p.add_argument("--json", default=None, metavar="PATH", help="write every number here")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="write a PNG of TTFT p50 against load (needs matplotlib)")
    return p


def _settings(args: argparse.Namespace) -> tuple[WorkloadConfig, FleetConfig]:
    from engines.simulator.engine import EngineShape
    from engines.simulator.fleet import FleetConfig
    from engines.simulator.rates import SimRates
    from engines.simulator.traffic import default_shape, workload

    try:
        rates = SimRates.load(args.rates) if args.rates else SimRates()
    except (OSError, ValueError) as exc:
        raise CommandError(f"--rates {args.rates}: {exc}") from None
    if args.scale <= 0 or args.output_scale <= 0 or args.sessions_per_worker < 1:
        raise CommandError("--scale and --output-scale must be > 0 and "
                           "--sessions-per-worker >= 1")
    sizes = (args.block_size, args.max_batch_tokens, args.max_seqs,
             *(n for n in (args.num_blocks, args.store_blocks) if n is not None))
    if min(sizes) < 1:
        raise CommandError("--block-size, --num-blocks, --max-batch-tokens, --max-seqs and "
                           "--store-blocks must be >= 1")
    wl = workload(args.scale, args.output_scale, seed=args.seed)
    shape = EngineShape(args.block_size, args.num_blocks if args.num_blocks is not None
                        else default_shape(wl, args.block_size).num_blocks,
                        args.max_batch_tokens, args.max_seqs)
    longest = shape.blocks_for(wl.max_prompt + wl.max_output)
    if shape.num_blocks < longest:
        raise CommandError(f"--num-blocks {shape.num_blocks}: the longest request needs "
                           f"{longest} blocks")
    return wl, FleetConfig(rates=rates, shape=shape, store_blocks=args.store_blocks)


def simulate(args: argparse.Namespace) -> int:
    from engines.simulator import plot
    from engines.simulator.report import rows, table
    from engines.simulator.sweep import run_point

    wl, fleet = _settings(args)
    if args.plot and not plot.available():
        raise CommandError("--plot needs matplotlib (pip install matplotlib), or leave "
                           "--plot out")
    points = []
    for workers in args.workers:
        for load in args.loads:
            pt = run_point(wl, fleet, workers=workers, load=load,
                           sessions=args.sessions_per_worker * workers,
                           policies=args.policies, stores=STORES[args.kvstore])
            points.append(pt)
            print(table(pt.results, f"\n{workers} workers, load {load:g}: {pt.requests} "
                        f"requests, goodput targets TTFT {pt.targets.ttft_target_s:.4g} s, "
                        f"ITL {pt.targets.itl_target_s:.4g} s"), flush=True)
    if args.json:
        doc = {"bench": "simulate", "machine": {"python": platform.python_version()},
               "rates": fleet.rates.as_dict(), "shape": dataclasses.asdict(fleet.shape),
               "points": [p.as_json() for p in points],
               "rows": [r for p in points for r in rows(p.results, workers=p.workers,
                                                        load=p.load)]}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.plot:
        plot.ttft_against_load(points, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli_kit.run(PROG, lambda: simulate(args))
