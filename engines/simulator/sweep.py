"""Runs of the simulator over policies, kvstore settings, fleet sizes and loads: what
``kvstore-router simulate`` and ``bench/bench_simulate.py`` report.

At each fleet size and load every policy serves the same requests (one seed), once without
and once with kvstore behind the workers, so their rows compare like for like.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, NamedTuple

from engines.router.policies import POLICIES
from engines.simulator.fleet import FleetConfig, simulate
from engines.simulator.report import summarize
from engines.simulator.traffic import Targets, sized, targets
from engines.workload import WorkloadConfig, generate


class Point(NamedTuple):
    """One fleet size and load: its traffic, targets and each (policy, kvstore)'s metrics."""

    workers: int
    load: float
    requests: int
    session_rate: float
    targets: Targets
    results: dict[tuple[str, bool], dict[str, float]]

    def as_json(self) -> dict[str, Any]:
        return {"workers": self.workers, "load": self.load, "requests": self.requests,
                "session_rate": self.session_rate, "targets": self.targets._asdict(),
                "results": [{"policy": p, "kvstore": s, **m}
                            for (p, s), m in self.results.items()]}


def run_point(wl: WorkloadConfig, fleet: FleetConfig, *, workers: int, load: float,
              sessions: int, policies: Iterable[str] = POLICIES,
              stores: Iterable[bool] = (False, True)) -> Point:
    """Every policy in ``policies`` with every kvstore setting in ``stores`` on ``workers``
    simulated workers, the traffic ``wl`` sized to ``load`` of their capacity."""
    base = dataclasses.replace(fleet, workers=workers)
    t = targets(wl, base)
    cfg = sized(wl, t, load, sessions, fleet.shape.block_size)
    reqs = generate(cfg)
    results = {}
    for store in stores:
        for policy in policies:
            out = simulate(reqs, dataclasses.replace(base, policy=policy, kvstore=store))
            results[(policy, store)] = summarize(out, t)
    return Point(workers, load, len(reqs), cfg.session_rate, t, results)
