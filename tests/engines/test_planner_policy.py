"""The planner's decision on given pool figures: it waits ``patience`` judgements, respects its
cooldown, takes a worker only from a pool under ``relax`` that keeps ``min_pool``, and so does
not flap between roles when load sits near a target."""

from __future__ import annotations

from engines.planner.observe import PoolView, percentile
from engines.planner.policy import Policy
from engines.planner.settings import PlannerSettings

S = PlannerSettings(router="http://r", ttft_target_s=1.0, itl_target_s=0.1, patience=3,
                    cooldown_s=10.0, relax=0.7, min_pool=1)


def pools(ttft: float, itl: float, n_pre: int = 1, n_dec: int = 2) -> dict[str, PoolView]:
    return {"prefill": PoolView("prefill", [f"p{i}" for i in range(n_pre)], 10, ttft, None, 0),
            "decode": PoolView("decode", [f"d{i}" for i in range(n_dec)], 10, 0.01, itl, 0)}


def test_waits_for_patience_then_moves_then_cools_down() -> None:
    p = Policy(S)
    assert p.decide(pools(2.0, 0.01), 0) is None
    assert p.decide(pools(2.0, 0.01), 1) is None
    act = p.decide(pools(2.0, 0.01), 2)
    assert act is not None and act.kind == "move" and act.pool == "prefill"
    assert act.desired == {"prefill": 2, "decode": 1}
    for t in range(3, 12):  # still hot, but inside the cooldown
        assert p.decide(pools(2.0, 0.01, 2, 1), t) is None


def test_a_strike_streak_is_broken_by_one_good_judgement() -> None:
    p = Policy(S)
    for t in range(20):  # over, over, under, ...: never three in a row
        assert p.decide(pools(2.0 if t % 3 else 0.5, 0.01), t) is None


def test_no_flapping_near_the_target() -> None:
    # prefill just over target, decode at 0.8 of its target (above relax): nothing to give,
    # so the planner recommends a worker rather than moving one that would go hot in turn
    p = Policy(S)
    acts = [p.decide(pools(1.1, 0.08), t) for t in range(3)]
    assert acts[:2] == [None, None]
    assert acts[2] is not None and acts[2].kind == "recommend" and acts[2].donor is None
    assert acts[2].desired == {"prefill": 2, "decode": 2}


def test_min_pool_keeps_the_last_worker() -> None:
    p = Policy(S)
    acts = [p.decide(pools(2.0, 0.01, 1, 1), t) for t in range(3)]
    assert acts[2] is not None and acts[2].kind == "recommend"


def test_decode_ttft_counts_only_without_a_prefill_pool() -> None:
    p = Policy(S)
    slow = PoolView("decode", ["d0"], 10, 5.0, 0.01, 0)
    alone = {"prefill": PoolView("prefill", [], 0, None, None, 0), "decode": slow}
    split = {"prefill": PoolView("prefill", ["p0"], 10, 0.5, None, 0), "decode": slow}
    assert p.pressures(alone)["decode"] == 5.0
    assert abs(p.pressures(split)["decode"] - 0.1) < 1e-9


def test_percentile_is_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 90) == 4.0
    assert percentile([7.0], 90) == 7.0
