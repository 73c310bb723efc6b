"""SLO capacity in the simulator: the search stops at a load that meets the attainment goal
and just below one that does not, a goal no fleet meets is capacity 0, and at 32 workers
KV-aware routing serves more within the targets than round-robin."""

from __future__ import annotations

import pytest

from engines.simulator import capacity
from engines.simulator.capacity import slo_capacity
from engines.simulator.fleet import FleetConfig
from engines.simulator.rates import SimRates
from engines.simulator.traffic import default_shape, workload

WL = workload(seed=0)
FLEET = FleetConfig(rates=SimRates(), shape=default_shape(WL))


def test_the_search_brackets_the_load_where_the_goal_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried: dict[float, float] = {}
    real = capacity.summarize

    def spy(out: list, t: object) -> dict[str, float]:  # type: ignore[type-arg]
        m = real(out, t)  # type: ignore[arg-type]
        tried[len(out)] = m["good_fraction"]
        return m

    monkeypatch.setattr(capacity, "summarize", spy)
    cap = slo_capacity(WL, FLEET, workers=8, sessions=48, policy="round-robin", kvstore=False)
    assert cap.attainment >= capacity.ATTAINMENT and 0 < cap.load < capacity.MAX_LOAD
    # every load tried served its own number of requests: more load is more sessions
    # (a fixed set of chats would cap the rate whatever the load)
    assert cap.runs == len(tried) >= 3
    # some load above the one reported missed the goal: the search found the edge
    assert min(tried.values()) < capacity.ATTAINMENT
    assert cap.goodput > 0


def test_a_goal_no_fleet_meets_is_capacity_zero() -> None:
    cap = slo_capacity(WL, FLEET, workers=8, sessions=24, policy="kv", kvstore=False,
                       attainment=1.01)
    assert cap.load == 0 and cap.goodput == 0 and cap.runs >= 2


def test_kv_aware_serves_more_within_the_targets_at_32_workers() -> None:
    kv, rr = (slo_capacity(WL, FLEET, workers=32, sessions=192, policy=p, kvstore=False)
              for p in ("kv", "round-robin"))
    assert kv.load > rr.load and kv.goodput > 1.1 * rr.goodput

