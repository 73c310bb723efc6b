"""The simulator's mechanics: step timing as the rates say, a bounded LRU cache, kvstore
loads, chat turns in order, determinism, the router's accounting back to zero, and KV-aware
routing beating round-robin on shared prefixes at 32 workers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from engines.router.cli import main as router_main
from engines.simulator.engine import EngineShape
from engines.simulator.fleet import Fleet, FleetConfig, simulate
from engines.simulator.rates import SimRates
from engines.simulator.store import SharedStore
from engines.simulator.traffic import default_shape, sized, targets, workload
from engines.workload import Request, generate, reuse_bound

RATES = SimRates(prefill_tokens_per_s=1000.0, decode_tokens_per_s=500.0,
                 load_tokens_per_s=4000.0, step_overhead_s=0.01, request_overhead_s=0.005)
SHAPE = EngineShape(block_size=4, num_blocks=64, max_batch_tokens=64, max_seqs=8)


def req(i: int, prompt: list[int], max_tokens: int = 4, at: float = 0.0,
        after: int | None = None, session: str = "s") -> Request:
    return Request(i, at, "oneoff", session, 0, -1, prompt, max_tokens, after)


def toks(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def fleet(**kw: object) -> FleetConfig:
    return FleetConfig(**{"workers": 1, "policy": "round-robin", "shape": SHAPE,
                          "rates": RATES, **kw})  # type: ignore[arg-type]


def test_one_request_alone_takes_the_steps_the_rates_give() -> None:
    (o,) = simulate([req(0, toks(100, 3), max_tokens=5)], fleet())
    # 100 prompt tokens in chunks of 64 and 36, then 4 decode steps of one sequence
    prefill = 2 * RATES.step_overhead_s + 100 / RATES.prefill_tokens_per_s
    assert o.ttft == pytest.approx(RATES.request_overhead_s + prefill)
    assert o.itl == pytest.approx(RATES.step_overhead_s + 1 / RATES.decode_tokens_per_s)
    assert o.tokens == 5 and o.hit_tokens == 0


def test_a_request_joins_a_run_of_decode_steps_at_the_next_step() -> None:
    first = req(0, toks(8, 3), max_tokens=200)
    late = req(1, toks(8, 50), max_tokens=2, at=0.5)
    out = {o.request: o for o in simulate([first, late], fleet())}
    # the late one waits at most one decode step of the first, then prefills beside it
    step = RATES.step_overhead_s + 1 / RATES.decode_tokens_per_s
    mixed = RATES.step_overhead_s + 8 / RATES.prefill_tokens_per_s + 1 / RATES.decode_tokens_per_s
    assert RATES.request_overhead_s + mixed <= out[1].ttft
    assert out[1].ttft <= RATES.request_overhead_s + step + mixed + 1e-9
    assert out[0].tokens == 200


def test_a_cache_that_cannot_hold_everything_evicts_the_least_recently_used() -> None:
    a, b, c = toks(17, 3), toks(17, 40), toks(17, 80)  # 4 reusable blocks each, 6 held
    small = EngineShape(block_size=4, num_blocks=12, max_batch_tokens=64)
    trace = [req(0, a, at=0), req(1, b, at=1), req(2, a, at=2), req(3, c, at=3),
             req(4, b, at=4), req(5, a, at=5)]
    out = {o.request: o.hit_tokens for o in simulate(trace, fleet(shape=small))}
    # a is reused at 2 (b's blocks went first); c then evicts b; b evicts a
    assert out == {0: 0, 1: 0, 2: 16, 3: 0, 4: 0, 5: 0}
    big = {o.request: o.hit_tokens for o in simulate(trace, fleet())}
    assert big == {0: 0, 1: 0, 2: 16, 3: 0, 4: 16, 5: 16}


def test_kvstore_behind_the_workers_is_loaded_not_computed() -> None:
    prompt = toks(41, 3)  # 10 reusable blocks
    trace = [req(0, prompt, at=0), req(1, prompt, at=1)]
    out = {o.request: o for o in simulate(trace, fleet(workers=2, kvstore=True))}
    assert out[1].hit_tokens == 40 and out[0].worker != out[1].worker
    load = RATES.step_overhead_s + 1 / RATES.prefill_tokens_per_s + 40 / RATES.load_tokens_per_s
    assert out[1].ttft == pytest.approx(RATES.request_overhead_s + load)
    assert {o.request: o.hit_tokens for o in simulate(trace, fleet(workers=2))} == {0: 0, 1: 0}


def test_the_router_prices_with_the_rates_its_workers_measured() -> None:
    """As a real worker, a simulated one reports what its steps measured
    (engines/decoder/rates.py): a decode step of one sequence pays the step overhead, so the
    reported decode rate is 1 / (overhead + 1 / marginal), not the marginal rate; a load is
    timed apart from the step's compute."""
    f = Fleet(fleet(kvstore=True))
    assert f.store is not None
    f.store.save(list(f.hasher.hash_blocks(toks(40, 3))))  # the prompt's 10 full blocks
    f.run([req(0, toks(41, 3), max_tokens=6)])
    (view,) = f.views
    decode = 1 / (RATES.step_overhead_s + 1 / RATES.decode_tokens_per_s)
    assert view.rates["decode_tokens_per_s"] == pytest.approx(decode)
    assert view.rates["load_tokens_per_s"] == pytest.approx(RATES.load_tokens_per_s)
    # one token computed in the step that loaded 40
    assert view.rates["prefill_tokens_per_s"] == pytest.approx(
        1 / (RATES.step_overhead_s + 1 / RATES.prefill_tokens_per_s))


def test_a_bounded_store_forgets_its_oldest_blocks() -> None:
    store = SharedStore(capacity_blocks=3)
    store.save([b"a", b"b", b"c"])
    assert store.lookup([b"a"]) == 1  # a is now recent
    store.save([b"d"])
    assert store.lookup([b"a", b"c", b"d"]) == 3 and store.lookup([b"b"]) == 0
    assert store.evictions == 1


def test_a_chat_turn_is_sent_after_the_previous_one_ends() -> None:
    trace = [req(0, toks(8, 3), max_tokens=50), req(1, toks(12, 3), at=0.01, after=0)]
    out = {o.request: o for o in simulate(trace, fleet())}
    assert out[1].sent == pytest.approx(out[0].end)
    assert out[1].hit_tokens == 8  # the first turn's blocks are still resident


def test_same_seed_same_outcomes_and_the_router_view_ends_empty() -> None:
    wl = workload(seed=3, sessions=40, session_rate=20.0)
    reqs = generate(wl)
    cfg = FleetConfig(workers=4, policy="kv", kvstore=True, shape=default_shape(wl))
    f = Fleet(cfg)
    first = f.run(reqs)
    assert first == simulate(reqs, cfg) and len(first) == len(reqs)
    assert all(v.queued == v.inflight == v.pending_prefill == v.decoding == 0 and not v.promised
               for v in f.views)
    assert sum(v.routed for v in f.views) == len(reqs)


def test_kv_aware_reuses_more_than_round_robin_on_shared_prefixes_at_32_workers() -> None:
    wl = workload(seed=1)
    shape = default_shape(wl)
    base = FleetConfig(workers=32, shape=shape)
    reqs = generate(sized(wl, targets(wl, base), 0.5, 32 * 12, shape.block_size))

    def hit_rate(policy: str) -> float:
        out = simulate(reqs, dataclasses.replace(base, policy=policy))
        return sum(o.hit_tokens for o in out) / sum(o.prompt_tokens for o in out)

    kv, rr = hit_rate("kv"), hit_rate("round-robin")
    assert kv > 1.5 * rr, (kv, rr)
    assert kv <= reuse_bound(reqs, shape.block_size)


def test_rates_json_round_trip_and_refusals(tmp_path: Path) -> None:
    path = tmp_path / "rates.json"
    RATES.save(path)
    assert SimRates.load(path) == RATES
    with pytest.raises(ValueError, match="unknown rate 'prefill'"):
        SimRates.from_dict({"prefill": 1})
    with pytest.raises(ValueError, match="decode_tokens_per_s must be > 0"):
        SimRates(decode_tokens_per_s=0)
    info = {"prefill_tokens_per_s": 900.0, "decode_tokens_per_s": None}
    assert SimRates.from_info(info).prefill_tokens_per_s == 900.0


def test_simulate_command_prints_the_table_and_writes_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim.json"
    rates = tmp_path / "rates.json"
    RATES.save(rates)
    assert router_main(["simulate", "--workers", "2", "--sessions-per-worker", "3",
                        "--policies", "kv,round-robin", "--kvstore", "off",
                        "--rates", str(rates), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 workers, load 0.5" in text and "round-robin" in text
    doc = json.loads(out.read_text())
    assert doc["bench"] == "simulate" and doc["rates"] == RATES.as_dict()
    kv_rows = [r for r in doc["rows"] if r["case"] == "TTFT p50, kv"]
    assert kv_rows and kv_rows[0]["baseline"] == "round-robin"


@pytest.mark.parametrize("argv,says", [
    (["--rates", "/nonexistent/rates.json"], "--rates /nonexistent/rates.json"),
    (["--workers", "0"], "--workers"),
    (["--policies", "fastest"], "unknown policy 'fastest'"),
    (["--num-blocks", "2"], "--num-blocks 2"),
    (["--block-size", "0"], "--block-size"),
    (["--store-blocks", "0"], "--store-blocks"),
    (["--scale", "0"], "--scale and --output-scale must be > 0"),
    (["--output-scale", "-1"], "--scale and --output-scale must be > 0"),
])
def test_bad_simulate_input_is_one_line_and_exit_2(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = router_main(["simulate", *argv])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
