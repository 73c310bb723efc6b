"""The planner's decision, apart from any I/O: given each pool's load against its targets,
move a worker, recommend scaling, or wait.

Each judgement the hottest pool over target (pressure above 1, see
:meth:`engines.planner.observe.PoolView.pressure`) gains a strike; a pool back under target
loses its strikes. After ``patience`` strikes in a row, and no sooner than ``cooldown_s`` after
the last action, the planner acts:

- **move** one worker from the other pool when that pool keeps more than ``min_pool`` workers
  after the move and its own pressure is under ``relax`` (so that the move cannot make the
  donor the next hot pool, the flapping a plain threshold would give), and the fleet is within
  ``fleet_size``;
- otherwise **recommend**: the pool sizes that would help, for an autoscaler (past
  ``fleet_size`` the move itself becomes a recommendation; when the donor has nothing to give,
  one more worker for the hot pool).
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, Field

from engines.planner.observe import PoolView
from engines.planner.settings import PlannerSettings


class Decision(BaseModel):
    """An action as the planner logs it (one JSON line of the fields set) and counts it."""

    event: str = Field(description="move or recommend")
    pool: str = Field(description="the pool over target")
    from_pool: str | None = Field(description="the pool a move takes a worker from")
    reason: str
    current: dict[str, int] = Field(description="workers per pool now")
    desired: dict[str, int] = Field(description="workers per pool after it")
    fleet: int
    recommended_fleet: int
    worker: str | None = Field(default=None, description="the worker a move switches; set "
                               "only then")


class Action(NamedTuple):
    kind: str  # "move" or "recommend"
    pool: str  # the pool over target
    donor: str | None  # the pool a move takes a worker from
    reason: str
    current: dict[str, int]
    desired: dict[str, int]

    def decision(self) -> Decision:
        return Decision(event=self.kind, pool=self.pool, from_pool=self.donor,
                        reason=self.reason, current=self.current, desired=self.desired,
                        fleet=sum(self.current.values()),
                        recommended_fleet=sum(self.desired.values()))


class Policy:
    """Strikes and cooldown between judgements; everything else comes in as arguments."""

    def __init__(self, settings: PlannerSettings) -> None:
        self.s = settings
        self.strikes = {"prefill": 0, "decode": 0}
        self.last_action = float("-inf")

    def pressures(self, pools: dict[str, PoolView]) -> dict[str, float]:
        s = self.s
        alone = not pools["prefill"].workers
        return {n: p.pressure(s.ttft_target_s, s.itl_target_s, s.max_queue,
                              n == "prefill" or alone) for n, p in pools.items()}

    def decide(self, pools: dict[str, PoolView], now: float) -> Action | None:
        s = self.s
        press = self.pressures(pools)
        hot = max(press, key=lambda n: press[n])
        for name in self.strikes:
            over = name == hot and press[name] > 1 and pools[name].workers
            self.strikes[name] = self.strikes[name] + 1 if over else 0
        if self.strikes[hot] < s.patience or now - self.last_action < s.cooldown_s:
            return None
        donor = "decode" if hot == "prefill" else "prefill"
        current = {n: len(p.workers) for n, p in pools.items()}
        spare = current[donor] > s.min_pool and press[donor] < s.relax
        self.last_action, self.strikes[hot] = now, 0
        why = (f"{hot} pressure {press[hot]:.2f} (ttft {_s(pools[hot].ttft_s)}, itl "
               f"{_s(pools[hot].itl_s)}, queue {pools[hot].queue:.1f}/worker) for "
               f"{s.patience} judgements; {donor} pressure {press[donor]:.2f}")
        if spare:
            desired = {hot: current[hot] + 1, donor: current[donor] - 1}
            fleet = sum(current.values())
            if s.fleet_size and fleet > s.fleet_size:
                return Action("recommend", hot, donor, f"{why}; fleet {fleet} is past "
                              f"fleet_size {s.fleet_size}: move left to the autoscaler",
                              current, desired)
            return Action("move", hot, donor, why, current, desired)
        desired = {hot: current[hot] + 1, donor: current[donor]}
        return Action("recommend", hot, None, f"{why}; {donor} has no worker to spare: "
                      f"scale {hot} up", current, desired)


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms"
