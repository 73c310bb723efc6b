"""SLO capacity: the most a fleet serves while it still meets its latency targets.

Goodput at one offered load says little while the fleet keeps up: every policy then serves
what arrives, and their goodputs agree. What routing changes is where the fleet stops keeping
up. As DistServe defines goodput (Zhong et al., OSDI 2024: "the maximum request rate that can
be served adhering to the SLO attainment goal"), :func:`slo_capacity` raises the offered load
until fewer than ``attainment`` (90%) of the requests meet both the TTFT and the ITL target,
and reports the good requests per second at the highest load that still met it. Every policy
is searched over the same loads, and at a given load serves the same requests. Sessions
arrive over the same span of time at every load (``sessions`` of them at load 1), so a higher
load is more sessions at once, not the same sessions sooner: chats wait for each answer and
think before the next turn, so a fixed set of sessions caps the rate whatever the load.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from engines.simulator.fleet import FleetConfig, simulate
from engines.simulator.report import summarize
from engines.simulator.traffic import sized, targets
from engines.workload import WorkloadConfig, generate

ATTAINMENT = 0.9  # the share of requests that must meet both targets
MAX_LOAD = 16.0  # a policy that keeps up beyond this is reported at it


class Capacity(NamedTuple):
    """The highest load found that met the attainment goal, and what was served there."""

    load: float
    goodput: float  # good requests/s at that load
    attainment: float  # the share of requests that met both targets there
    runs: int  # simulations the search took


def slo_capacity(wl: WorkloadConfig, fleet: FleetConfig, *, workers: int, sessions: int,
                 policy: str, kvstore: bool, attainment: float = ATTAINMENT,
                 start: float = 0.5, steps: int = 5) -> Capacity:
    """Double the load from ``start`` until the goal fails (halve it if it fails at once),
    then bisect (geometrically) ``steps`` times between the last load that met it and the
    first that did not. A fleet that misses the goal even at ``start / 64`` has capacity 0.
    ``sessions`` is the number of sessions at load 1."""
    base = dataclasses.replace(fleet, workers=workers)
    t = targets(wl, base)
    run = dataclasses.replace(base, policy=policy, kvstore=kvstore)
    seen: dict[float, tuple[float, float]] = {}  # load -> (good fraction, goodput)

    def meets(load: float) -> bool:
        if load not in seen:
            # sessions arrive over the same span at every load: more load, more sessions
            count = max(1, round(sessions * load))
            out = simulate(generate(sized(wl, t, load, count, fleet.shape.block_size)), run)
            m = summarize(out, t)
            seen[load] = (m["good_fraction"], m["goodput"])
        return seen[load][0] >= attainment

    lo = hi = start
    if meets(start):
        while meets(hi) and hi < MAX_LOAD:
            lo, hi = hi, hi * 2
        if meets(hi):
            lo = hi
    else:
        while not meets(lo) and lo > start / 64:
            hi, lo = lo, lo / 2
        if not meets(lo):
            return Capacity(0.0, 0.0, seen[lo][0], len(seen))
    if lo < hi:
        for _ in range(steps):
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    fraction, goodput = seen[lo]
    return Capacity(lo, goodput, fraction, len(seen))
