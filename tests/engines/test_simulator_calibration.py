"""The simulator against a real run: two real workers (processes, the routing bench's flags)
behind the real router serve a trace of the routing bench's traffic; the simulator, with
rates measured from those workers (:func:`engines.simulator.calibrate.measure`), serves the
same trace. TTFT p50 and the prefix hit rate must agree within 20%.

The real side reuses ``bench/engine_routing.py``'s client (:func:`drive`: each request at its
arrival time, a chat turn after the previous answer, streamed) so both see the same clients.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.simulator.calibrate import measure, measure_route
from engines.simulator.fleet import FleetConfig, simulate
from engines.simulator.rates import SimRates
from engines.simulator.traffic import default_shape, sized, targets, workload
from engines.tiny_model import llama_config, write_checkpoint
from engines.workload import generate
from kvstore.testing.engines import Proc, ThreadServer, engine_proc

# bench/ is not a package: its scripts import one another from their folder
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from engine_routing import drive

pytestmark = pytest.mark.slow

VOCAB = 512
TOLERANCE = 0.20
POLICIES = ("kv", "round-robin")
REPS = 2  # per policy, interleaved; TTFTs pooled (the machine's speed drifts)
# of the fleet's capacity: low, because the two real workers share this machine's cores
# (and its other jobs) while the simulated ones each own theirs; the more often both compute
# at once, the more the real run is slowed by processor sharing that a fleet would not have
LOAD = 0.25
SHAPE = default_shape(workload(vocab=VOCAB))  # the routing bench's worker flags


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Proc]]:
    """Two workers of a small model on which prefill is most of a request's first token."""
    cfg = llama_config(vocab=VOCAB, kv_heads=2, max_position_embeddings=4096, hidden=256,
                       intermediate=688, layers=4, heads=8)  # the routing bench's model
    model = write_checkpoint(tmp_path_factory.mktemp("sim-model"), cfg, seed=0)
    args = ("--block-size", str(SHAPE.block_size), "--num-blocks", str(SHAPE.num_blocks),
            "--max-batch-tokens", str(SHAPE.max_batch_tokens), "--kernels", "numpy")
    procs = [engine_proc(model, args=args).start(wait=False) for _ in range(2)]
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.stop()


def calibrate(workers: list[Proc], seed: int, long: int = 240) -> SimRates:
    """The rates now, on the path the clients take: a worker's probes, and the router's (a
    thread of this process, as in the bench) and SSE's overhead. Measured just before and
    just after each run, as the machine's speed drifts within minutes."""
    rates = measure(workers[seed % 2].url, vocab=VOCAB - 10, repeats=2, seed=seed, long=long,
                    max_batch_tokens=SHAPE.max_batch_tokens)
    probe = ThreadServer(router_app(Router([p.url for p in workers]))).start()
    try:
        return measure_route(probe.url, rates, vocab=VOCAB - 10, repeats=8, seed=seed)
    finally:
        probe.stop()


def test_simulator_matches_a_real_two_worker_run(workers: list[Proc]) -> None:
    wl = workload(vocab=VOCAB)
    warm = ThreadServer(router_app(Router([p.url for p in workers]))).start()
    try:
        # warm-up: traffic of the trace's lengths, so that the first measured run pays for
        # no first-time allocations (prompts up to 1024 tokens, longer than the probes)
        asyncio.run(drive(warm.url, generate(dataclasses.replace(
            wl, salt=99, sessions=8, session_rate=20.0))))
    finally:
        warm.stop()
    rates = calibrate(workers, seed=99)  # sizes the traffic
    fleet = FleetConfig(workers=2, shape=SHAPE, rates=rates)
    t = targets(wl, fleet)
    cfg = sized(wl, t, LOAD, 14, SHAPE.block_size)
    pooled: dict[tuple[str, str], dict[str, list[float]]] = {
        (p, side): {"ttft": [], "hit": [], "prompt": []}
        for p in POLICIES for side in ("real", "sim")}
    for rep in range(REPS):  # policies interleaved
        for i, policy in enumerate(POLICIES):
            before = calibrate(workers, seed=10 * rep + i, long=t.mean_prompt)
            reqs = generate(dataclasses.replace(cfg, salt=1 + i + 10 * rep))
            router = ThreadServer(router_app(Router([p.url for p in workers], policy=policy)))
            router.start()
            try:
                real = asyncio.run(drive(router.url, reqs))
                stats = httpx.get(f"{router.url}/stats").json()
            finally:
                router.stop()
            after = calibrate(workers, seed=10 * rep + i + 5, long=t.mean_prompt)
            now = SimRates(**{k: (v + after.as_dict()[k]) / 2
                              for k, v in before.as_dict().items()})
            sim = simulate(reqs, dataclasses.replace(fleet, policy=policy, rates=now))
            r, s = pooled[(policy, "real")], pooled[(policy, "sim")]
            r["ttft"] += [x["ttft"] for x in real]
            r["hit"].append(stats["hit_tokens"])
            r["prompt"].append(stats["prompt_tokens"])
            s["ttft"] += [o.ttft for o in sim]
            s["hit"].append(sum(o.hit_tokens for o in sim))
            s["prompt"].append(sum(o.prompt_tokens for o in sim))
            print(f"\nrep {rep} {policy}: {len(reqs)} requests, rates {now.as_dict()}: "
                  f"TTFT p50 real {np.percentile(r['ttft'][-len(real):], 50):.4g} "
                  f"sim {np.percentile(s['ttft'][-len(sim):], 50):.4g} s, hit rate real "
                  f"{r['hit'][-1] / r['prompt'][-1]:.4g} sim {s['hit'][-1] / s['prompt'][-1]:.4g}")
    for policy in POLICIES:
        got = {side: (float(np.percentile(pooled[(policy, side)]["ttft"], 50)),
                      sum(pooled[(policy, side)]["hit"]) / sum(pooled[(policy, side)]["prompt"]))
               for side in ("real", "sim")}
        print(f"{policy}, {REPS} runs pooled: TTFT p50 real {got['real'][0]:.4g} sim "
              f"{got['sim'][0]:.4g} s ({got['sim'][0] / got['real'][0] - 1:+.1%}); hit rate "
              f"real {got['real'][1]:.4g} sim {got['sim'][1]:.4g} "
              f"({got['sim'][1] / got['real'][1] - 1:+.1%})")
        for k, key in enumerate(("ttft_p50", "hit_rate")):
            was, now_ = got["real"][k], got["sim"][k]
            assert abs(now_ - was) <= TOLERANCE * was, (policy, key, was, now_)
