"""The SLO planner against fixed prefill/decode splits on a simulated fleet, sized as
``bench/bench_planner.py`` sizes the real one.

Targets are the lone request's latencies times ``slack`` (TTFT of a phase-A request, ITL of a
phase-B one, each alone on an idle fleet). Each phase arrives at ``load`` times what the even
split sustains of its shape (a burst of that shape on the even split, served to the end), so
at ``load`` 1 the even split is saturated in both phases and the busy pool wants more workers.
Every fixed split serves the same trace, then the planner (starting from the even split, with
the settings the real bench gives it) does. Goodput is requests per second that met both
targets.
"""

from __future__ import annotations

import statistics
from typing import Any

from engines.planner.settings import PlannerSettings
from engines.simulator.engine import EngineShape
from engines.simulator.pools import PoolConfig, PoolFleet, Served, serve
from engines.simulator.rates import SimRates
from engines.simulator.shift import Arrival, two_phase_trace

SHAPE = EngineShape(block_size=16, num_blocks=2048, max_batch_tokens=512, max_seqs=32)
PHASE_A, PHASE_B = (384, 4), (16, 48)  # (prompt, output) as two_phase_trace's defaults
BURST_PER_WORKER = 60  # requests per worker of the burst that measures a phase's capacity


def planner_settings(ttft_t: float, itl_t: float) -> PlannerSettings:
    """The planner as ``bench/bench_planner.py`` runs it (``router`` names nothing here)."""
    return PlannerSettings.model_validate({
        "router": "http://simulated", "ttft_target_s": ttft_t, "itl_target_s": itl_t,
        "window_s": 2, "min_samples": 3, "interval_s": 0.5, "patience": 2, "cooldown_s": 2,
        "max_queue": 2})


def lone(shape: tuple[int, int], rates: SimRates) -> Served:
    """One request of ``shape`` alone on an idle fleet of one prefill and one decode worker."""
    return serve([Arrival(0.0, *shape, "-")], PoolConfig(2, 1, shape=SHAPE, rates=rates)).served[0]


def capacity(shape: tuple[int, int], workers: int, rates: SimRates) -> float:
    """Requests/s the even split completes of a burst of ``shape``."""
    burst = [Arrival(0.0, *shape, "-")] * (BURST_PER_WORKER * workers)
    done = serve(burst, PoolConfig(workers, workers // 2, shape=SHAPE, rates=rates)).served
    return len(done) / max(s.end for s in done)


def summarize(fleet: PoolFleet, ttft_t: float, itl_t: float,
              duration_s: float) -> dict[str, Any]:
    out = fleet.served
    good = [s for s in out if s.ttft <= ttft_t and s.itl <= itl_t]
    ttft = sorted(s.ttft for s in out)
    itl = sorted(s.itl for s in out if s.arrival.max_tokens > 1)
    return {"goodput": len(good) / duration_s, "good_fraction": len(good) / len(out),
            "ttft_p50": statistics.median(ttft), "ttft_p90": ttft[int(0.9 * (len(ttft) - 1))],
            "itl_p50": statistics.median(itl), "itl_p90": itl[int(0.9 * (len(itl) - 1))],
            "moves": fleet.moves, "requests": len(out)}


def compare(workers: int, duration_s: float, *, load: float = 1.0, seed: int = 1,
            slack: float = 4.0, rates: SimRates | None = None,
            splits: list[int] | None = None) -> dict[str, Any]:
    """Every fixed split in ``splits`` (prefill workers; default every eighth of the fleet)
    and the planner on one two-phase trace of ``duration_s`` seconds: the targets, the rates,
    each run's summary (``runs``), the planner's pool sizes over time (``timeline``) and its
    requests as served (``planner_served``)."""
    rates = rates or SimRates()
    ttft_t = slack * lone(PHASE_A, rates).ttft
    itl_t = slack * lone(PHASE_B, rates).itl
    rate_a = load * capacity(PHASE_A, workers, rates)
    rate_b = load * capacity(PHASE_B, workers, rates)
    trace = two_phase_trace(seed, duration_s, rate_a, rate_b)
    step = max(1, workers // 8)
    runs: dict[str, dict[str, Any]] = {}
    for n in splits or list(range(step, workers, step)):
        fleet = serve(trace, PoolConfig(workers, n, shape=SHAPE, rates=rates))
        runs[f"static {n}P+{workers - n}D"] = summarize(fleet, ttft_t, itl_t, duration_s)
    planned = serve(trace, PoolConfig(workers, workers // 2, planner_settings(ttft_t, itl_t),
                                      shape=SHAPE, rates=rates))
    runs["planner"] = summarize(planned, ttft_t, itl_t, duration_s)
    return {"workers": workers, "duration_s": duration_s, "load": load, "seed": seed,
            "ttft_target_s": ttft_t, "itl_target_s": itl_t, "rate_a": rate_a, "rate_b": rate_b,
            "requests": len(trace), "runs": runs,
            "timeline": [s._asdict() for s in planned.timeline],
            "planner_served": planned.served}  # for plots; not JSON
