"""Does the SLO planner beat the best fixed prefill/decode split at fleet sizes this machine
cannot run? The question of ``bench/bench_planner.py``, on a simulated fleet.

A simulated disaggregated fleet (:mod:`engines.simulator.pools`: the router's own policy ranks
each pool, prefill workers save to kvstore and decode workers load from it, worker speeds from
:class:`engines.simulator.rates.SimRates`) replays one two-phase trace (long prompts / short
outputs, then short prompts / long outputs; :mod:`engines.simulator.shift`) once per fixed
split (every eighth of the fleet in the prefill pool) and once with the real planner policy
moving workers, started from the even split with the real bench's planner settings
(:mod:`engines.simulator.planning`). Each phase arrives at ``load`` times what the even split
sustains of it (a saturated burst), so above 1 the busy pool of every fixed split that suits
one phase is short in the other. Targets are the lone request's TTFT and ITL times 4.

Rows: each run's goodput (requests/s meeting both targets) against the best fixed split's;
the planner's row has target > 1 (the issue's: higher than the best static split). The full
run is 32 workers at loads 1.0, 1.15 and 1.3; ``--quick`` 16 workers at load 1.15. The
simulator is deterministic: there is no noise to interleave against. ``--plot`` draws the
planner's pool sizes and its requests' latency over time (first load).

Usage: ``python bench/bench_planner_sim.py [--quick] [--json PATH] [--plot PATH]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import report, row

from engines.simulator import plot as sim_plot
from engines.simulator.planning import compare


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    runs = result["runs"]
    best = max((k for k in runs if k.startswith("static")), key=lambda k: runs[k]["goodput"])
    return [row(f"goodput, {k}", "req/s", v["goodput"], best, runs[best]["goodput"],
                higher_is_better=True, target=1.0 if k == "planner" else None,
                workers=result["workers"], load=result["load"],
                good_fraction=round(v["good_fraction"], 4), moves=v["moves"])
            for k, v in runs.items()]


def plot(path: str, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    half = result["duration_s"] / 2
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    sizes = result["timeline"]
    t = [s["at"] for s in sizes] + [result["duration_s"]]
    for pool in ("prefill", "decode"):
        ax1.step(t, [s[pool] for s in sizes] + [sizes[-1][pool]], where="post", label=pool)
    ax1.set_ylabel("workers")
    ax1.legend()
    ax1.set_title(f"simulated planner, {result['workers']} workers, load {result['load']}: "
                  "pool sizes, TTFT and ITL")
    served = result["planner_served"]
    ax2.scatter([s.arrival.t for s in served], [s.ttft for s in served], s=2)
    ax2.axhline(result["ttft_target_s"], color="red", lw=1, label="target")
    ax2.set_ylabel("TTFT (s)")
    ax2.set_yscale("log")
    ax2.legend()
    gaps = [s for s in served if s.arrival.max_tokens > 1]
    ax3.scatter([s.arrival.t for s in gaps], [s.itl for s in gaps], s=2)
    ax3.axhline(result["itl_target_s"], color="red", lw=1)
    ax3.set_ylabel("ITL (s)")
    ax3.set_yscale("log")
    ax3.set_xlabel(f"seconds (arrival); phase B from {half:.0f} s")
    for ax in (ax1, ax2, ax3):
        ax.axvline(half, color="gray", ls="--", lw=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 workers, one load, 40 s")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the JSON report")
    ap.add_argument("--plot", default=None, metavar="PATH", help="write a PNG")
    args = ap.parse_args()
    workers, duration = (16, 40.0) if args.quick else (32, 120.0)
    loads = (1.15,) if args.quick else (1.0, 1.15, 1.3)
    rows: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    started = time.perf_counter()
    for load in loads:
        result = compare(workers, duration, load=load)
        first = first or result
        print(f"  load {load}: {result['requests']} requests, targets TTFT "
              f"{result['ttft_target_s'] * 1e3:.0f} ms, ITL {result['itl_target_s'] * 1e3:.1f} "
              f"ms, {time.perf_counter() - started:.0f} s", flush=True)
        rows += rows_of(result)
    report("planner_sim", rows, args.json)
    if args.plot and first is not None:
        if sim_plot.available():
            plot(args.plot, first)
        else:
            print("--plot: matplotlib is not installed; no PNG written")


if __name__ == "__main__":
    main()
