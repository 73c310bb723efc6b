"""The simulated disaggregated fleet: a request's prompt is computed on a prefill worker and
loaded from kvstore by a decode worker, a fleet without one pool serves whole requests, and
the real planner policy moves workers to the pool the traffic needs, beating the best fixed
split on traffic that shifts."""

from __future__ import annotations

import pytest

from engines.simulator import planning
from engines.simulator.engine import EngineShape
from engines.simulator.pools import PoolConfig, serve
from engines.simulator.rates import SimRates
from engines.simulator.shift import Arrival, two_phase_trace

RATES = SimRates(prefill_tokens_per_s=1000.0, decode_tokens_per_s=500.0,
                 load_tokens_per_s=4000.0, step_overhead_s=0.01, request_overhead_s=0.005)
SHAPE = EngineShape(block_size=4, num_blocks=256, max_batch_tokens=64, max_seqs=8)


def test_a_request_is_prefilled_on_one_pool_and_decoded_from_kvstore_on_the_other() -> None:
    fleet = serve([Arrival(0.0, 40, 5, "A")], PoolConfig(2, 1, shape=SHAPE, rates=RATES))
    (s,) = fleet.served
    # prefill: 40 tokens in one chunk of 40 after the hop; the first token ends that step
    prefill = RATES.request_overhead_s + RATES.step_overhead_s + 40 / 1000
    assert s.ttft == pytest.approx(prefill)
    # decode: another hop, 9 blocks loaded and the last one (with the last prompt token,
    # always computed) computed, then 3 steps of one token
    first_decode = (RATES.request_overhead_s + RATES.step_overhead_s + 4 / 1000 + 36 / 4000)
    rest = 3 * (RATES.step_overhead_s + 1 / 500)
    assert s.itl == pytest.approx((first_decode + rest) / 4)
    prefiller, decoder = fleet.engines
    assert prefiller.steps == 1 and decoder.steps == 4
    blocks = [(0).to_bytes(4, "big") + b.to_bytes(4, "big") for b in range(10)]
    assert fleet.store.lookup(blocks, touch=False) == 10  # saved by the prefill worker


def test_with_no_prefill_pool_a_worker_serves_the_whole_request() -> None:
    fleet = serve([Arrival(0.0, 40, 5, "A")], PoolConfig(2, 0, shape=SHAPE, rates=RATES))
    (s,) = fleet.served
    assert s.ttft == pytest.approx(RATES.request_overhead_s + RATES.step_overhead_s + 0.04)
    assert s.itl == pytest.approx(RATES.step_overhead_s + 1 / 500)
    assert sum(e.steps for e in fleet.engines) == 5


def test_the_planner_moves_workers_to_the_pool_the_traffic_needs() -> None:
    result = planning.compare(8, 30.0, load=1.15)
    sizes = [s["prefill"] for s in result["timeline"]]
    half = result["duration_s"] / 2
    in_a = [s["prefill"] for s in result["timeline"] if s["at"] < half]
    assert max(in_a) > 4  # phase A: prompts; more prefill workers than the even split
    assert sizes[-1] < max(in_a)  # phase B: outputs; workers go back to decode
    runs = result["runs"]
    best = max(v["goodput"] for k, v in runs.items() if k != "planner")
    assert runs["planner"]["goodput"] > best
    assert runs["planner"]["moves"] == len(result["timeline"]) - 1 > 0


def test_fixed_splits_never_move_and_the_trace_is_the_same_for_every_run() -> None:
    trace = two_phase_trace(3, 4.0, 20.0, 20.0)
    a = serve(trace, PoolConfig(4, 2, shape=SHAPE, rates=RATES))
    b = serve(trace, PoolConfig(4, 2, shape=SHAPE, rates=RATES))
    assert a.served == b.served and a.moves == 0 and len(a.timeline) == 1
    assert len(a.served) == len(trace)
