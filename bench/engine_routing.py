"""The routing section of ``bench_engine.py``: the four routing policies on the same generated
traffic (:mod:`engines.workload`), with and without kvstore behind the workers.

The machine is shared and its speed drifts by several times within minutes, so the policies
run at the same time, each on its own pool of ``WORKERS`` engine worker processes with its own
router (a thread of this process) and client: whatever else loads the machine loads every
policy alike. (A policy that computes less leaves more CPU to the others, which narrows the
differences rather than widening them.) Worker ``i`` of every pool is pinned to core ``i``
(modulo the cores), so a pool's workers do not take CPU from one another, as accelerators
would not, and the workers run at a lower priority (``WORKER_NICE``) than this process, whose
routers and clients would otherwise wait for a core behind eight busy workers (the routing
path has its own CPUs in a real deployment). The pools without kvstore run first, then pools
whose workers share one ``kvstore serve``. Each client sends each request at its arrival time
(a chat turn also waits for the previous turn's answer, as a user would) and streams the
answer. Each worker's cache holds a small share of the traffic's shared prefixes
(``traffic.CACHE_SHARE``), so placement matters; the model and prompts are sized so that prefill
dominates TTFT (each request's split into queueing, loading, prefill and the rest, as its
worker measured it, is reported per policy).

A calibration step sends a few prompts straight to every worker (each prompt to both workers
of a kvstore pool, so the second loads it), so the workers have measured their prefill,
decode and load rates before a router prices anything; it measures the unloaded TTFT and ITL
of a mean-sized request (see :func:`unloaded`), which set the goodput targets (``TTFT_SLO``
and ``ITL_SLO`` times them), and the capacity of the pools bursting together, without and
with cache hits, which sets the arrival rate (see :func:`sized`).

Every policy sees the same arrivals and lengths (the workload's ``seed``, one per repetition)
with its own token values (its ``salt``), so no pool reuses another's prefixes. Per run: TTFT
p50/p99, ITL p50 (per request, the mean gap between its tokens), output tokens/s, prefix hit
rate (tokens not computed, local or from kvstore), the busiest worker's share of requests and
goodput (requests per second meeting both targets); beside them, the hit rate of one cache
that never evicts on the same requests (:func:`engines.workload.reuse_bound`), which no
policy can beat, and that of one worker's cache serving all of them (the fleet with kvstore
should do at least as well).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.router.cost import RATE_KEYS
from engines.simulator import traffic
from engines.testing import ThreadServer, engine_proc
from engines.workload import Request, WorkloadConfig, generate, reuse_bound

POLICIES = ("round-robin", "least-loaded", "session", "kv")
# workers per pool: with 2, round-robin lands a chat's next turn on the worker holding its
# history half the time by chance, which no fleet worth routing has (the simulator, same
# traffic, policies and load, three seeds, without kvstore: KV-aware's TTFT p50 gain over
# round-robin is 1.15-1.60x at 2 workers, 1.54-2.04x at 4, 2.10-2.40x at 8; with kvstore
# 1.02-1.27x, as the store gives every policy the same hits)
WORKERS = 4
BLOCK = 16
LOAD = 0.5  # offered work at the reuse bound, as a fraction of the fleet's capacity
MIN_SESSIONS = 24  # per run, however slow the machine: fewer make the percentiles noise
# goodput targets, multiples of the unloaded TTFT and ITL (the simulator's, as its traffic)
TTFT_SLO, ITL_SLO = traffic.TTFT_SLO, traffic.ITL_SLO
# the workers' CPU priority below this process's (routers and clients): on a real fleet they
# have their own cores; here eight busy workers would otherwise starve the routing path
WORKER_NICE = 10


def workload(vocab: int) -> WorkloadConfig:
    """The traffic's shape, shared with the simulator (:func:`engines.simulator.traffic.
    workload`: lengths shrunk to what a small CPU model serves in seconds, prompts shrunk
    less than outputs, so that prefill dominates TTFT; the session count and rate are set by
    :func:`sized`)."""
    return traffic.workload(vocab=vocab)


class Pools:
    """One pool of worker processes per policy (all with or all without kvstore)."""

    def __init__(self, model: Path, cfg: WorkloadConfig, kvstore: str | None) -> None:
        # each worker's cache: ``CACHE_SHARE`` of the shared prefixes, as the simulator's
        self.num_blocks = traffic.cache_blocks(cfg, BLOCK)
        args = ("--block-size", str(BLOCK), "--num-blocks", str(self.num_blocks),
                "--max-batch-tokens", "256", "--kernels", "numpy")
        self.kvstore = kvstore
        # worker i of every pool on core i: a pool's two workers never share a core (as two
        # accelerators would not), and every pool's worker i competes alike
        cores = sorted(os.sched_getaffinity(0))
        self.procs = {p: [engine_proc(model, kvstore=kvstore, args=args, nice=WORKER_NICE,
                                      cpus={cores[i % len(cores)]}).start(wait=False)
                          for i in range(WORKERS)] for p in POLICIES}
        for pool in self.procs.values():
            for proc in pool:
                proc.wait_ready()

    def urls(self, policy: str) -> list[str]:
        return [p.url for p in self.procs[policy]]

    def stop(self) -> None:
        for pool in self.procs.values():
            for p in pool:
                p.stop()


def _generate(url: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    r = httpx.post(f"{url}/generate", json={"prompt_ids": prompt, "max_tokens": max_tokens,
                                            "ignore_eos": True}, timeout=600)
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def warm(pools: Pools, cfg: WorkloadConfig) -> dict[str, float]:
    """Warm every worker's rates (each prompt to both workers of a pool: with kvstore the
    second loads it); the mean prompt and output lengths of the traffic."""
    reqs = generate(dataclasses.replace(cfg, salt=10_000))
    mean_len = int(statistics.mean(len(r.prompt) for r in reqs))
    mean_out = max(2, int(statistics.mean(r.max_tokens for r in reqs)))
    for k, policy in enumerate(POLICIES):
        for i in range(2):
            prompt = fresh(cfg, mean_len, 1000 * k + i + (500 if pools.kvstore else 0))
            for j, url in enumerate(pools.urls(policy)):
                _generate(url, prompt if pools.kvstore else [*prompt[1:], j + 3], mean_out)
    return {"mean_prompt": mean_len, "mean_output": mean_out}


def unloaded(pools: Pools, cfg: WorkloadConfig, sizes: dict[str, float]) -> dict[str, float]:
    """TTFT and ITL (medians) of a mean-sized request that neither queues nor shares a batch:
    every worker of every pool serves one at the same time, as the machine is shared during
    the runs (one worker alone would get a whole core, which no run gives it). The goodput
    targets are ``TTFT_SLO`` and ``ITL_SLO`` times them, as a deployment derives its SLOs
    from its hardware's latency without contention."""
    n, out = int(sizes["mean_prompt"]), int(sizes["mean_output"])
    urls = [u for p in POLICIES for u in pools.urls(p)]

    async def together(round_: int) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=600) as client:
            rs = await asyncio.gather(*(client.post(f"{u}/generate", json={
                "prompt_ids": fresh(cfg, n, 7000 + 100 * round_ + i), "max_tokens": out,
                "ignore_eos": True}) for i, u in enumerate(urls)))
        return [r.json() for r in rs]

    docs = [d for k in range(3) for d in asyncio.run(together(k))]
    ttft = statistics.median(d["ttft_s"] for d in docs)
    itl = statistics.median((d["latency_s"] - d["ttft_s"]) / (out - 1) for d in docs)
    return {"unloaded_ttft_s": ttft, "unloaded_itl_s": itl, "ttft_target_s": TTFT_SLO * ttft,
            "itl_target_s": ITL_SLO * itl}


def fresh(cfg: WorkloadConfig, n: int, i: int) -> list[int]:
    """A prompt of ``n`` tokens that shares nothing with the workload's."""
    return generate(dataclasses.replace(cfg, salt=20_000 + i, sessions=1, chat_share=0,
                                        rag_share=0, oneoff_len=n, length_sigma=0.01))[0].prompt


def capacity(pools: Pools, cfg: WorkloadConfig, sizes: dict[str, float]) -> dict[str, float]:
    """Requests/s one pool completes while every pool works through a burst of mean-sized
    requests: fresh prompts (no cache hit), then the same prompts again on the same workers
    (all but their last block cached). Both ends are measured because reuse saves only the
    prefill: the output still decodes token by token, which on this CPU model costs as much
    as the prompt (on a GPU, batched decoding costs far less than prefill)."""
    n, out = int(sizes["mean_prompt"]), int(sizes["mean_output"])
    jobs = [(url, fresh(cfg, n, 5000 + i)) for i in range(3)
            for p in POLICIES for url in pools.urls(p)]

    async def burst() -> float:
        async with httpx.AsyncClient(timeout=600) as client:
            started = time.perf_counter()
            await asyncio.gather(*(client.post(f"{u}/generate", json={
                "prompt_ids": p, "max_tokens": out, "ignore_eos": True}) for u, p in jobs))
            return time.perf_counter() - started

    per_pool = len(jobs) / len(POLICIES)
    miss = per_pool / asyncio.run(burst())
    return {"capacity_miss_rps": miss, "capacity_hit_rps": per_pool / asyncio.run(burst())}


def sized(cfg: WorkloadConfig, calib: dict[str, float], seconds: float) -> WorkloadConfig:
    """``cfg`` with sessions arriving for about ``seconds`` at the rate that loads the fleet
    to ``LOAD`` of its capacity if it hit the bound (every prefix seen before reused): a
    policy that reuses less works harder, as on a fleet sized for its cache. A request's
    seconds of fleet time are interpolated between the measured ends, by the share of its
    prompt it reuses."""
    reqs = generate(cfg)
    per_session = len(reqs) / cfg.sessions
    bound = reuse_bound(reqs, BLOCK)
    per_request_s = (1 - bound) / calib["capacity_miss_rps"] + bound / calib["capacity_hit_rps"]
    rate = LOAD / per_request_s / per_session
    return dataclasses.replace(cfg, session_rate=rate, sessions=max(MIN_SESSIONS,
                                                                    round(rate * seconds)))


def one_worker_hit_rate(reqs: list[Request], num_blocks: int) -> float:
    """The prefix hit rate of one worker's cache (the engine's own block manager, same size)
    serving every request, one at a time, in arrival order."""
    from engines.decoder.paged_kv import BlockManager
    from kvstore.keys import BlockHasher

    blocks, hasher = BlockManager(num_blocks), BlockHasher("sha256", None, BLOCK)
    hit = total = 0
    for r in reqs:
        hashes = list(hasher.hash_blocks(r.prompt))[:(len(r.prompt) - 1) // BLOCK]
        local = blocks.match_prefix(hashes)
        blocks.take(local)
        fresh = blocks.allocate(-(-(len(r.prompt) + r.max_tokens) // BLOCK) - len(local))
        table = local + fresh
        for b, h in zip(table[len(local):], hashes[len(local):], strict=False):
            blocks.publish(b, h)
        blocks.release(table)
        hit += len(local) * BLOCK
        total += len(r.prompt)
    return hit / total


async def drive(url: str, reqs: list[Request]) -> list[dict[str, float]]:
    """Send every request at its arrival time (a turn after its previous turn's answer);
    per request: TTFT, ITL, output tokens, finish time."""
    done = {r.index: asyncio.Event() for r in reqs}
    out: list[dict[str, float]] = []
    t0 = time.perf_counter() + 0.2

    async def one(client: httpx.AsyncClient, r: Request) -> None:
        await asyncio.sleep(max(0.0, t0 + r.at - time.perf_counter()))
        if r.after is not None:
            await done[r.after].wait()
        body = {"prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "user": r.session}
        start = time.perf_counter()
        stamps: list[float] = []
        first: dict[str, Any] = {}
        try:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        doc = json.loads(line[6:])
                        stamps += [time.perf_counter()] * len(doc["choices"][0]["token_ids"])
                        first = first or doc.get("kvstore", {})
        finally:
            done[r.index].set()
        n = len(stamps)
        ttft = stamps[0] - start
        parts = {k: float(first[k]) for k in ("queue_s", "load_s", "prefill_s")}
        out.append({"ttft": ttft, "tokens": n, "end": stamps[-1] - t0,
                    "itl": (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else 0.0,
                    **parts, "overhead_s": ttft - sum(parts.values()),
                    "computed": len(r.prompt) - int(first["cached_tokens"])})

    # no keep-alive: a connection the router closes as idle while a request goes out on it
    # would fail that request (requests here come seconds apart)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(one(client, r) for r in reqs))
    return out


def run_all(pools: Pools, reqs: dict[str, list[Request]],
            calib: dict[str, float]) -> dict[str, dict[str, float]]:
    """Every policy at once, each on its pool with its own requests; metrics per policy."""
    routers = {p: ThreadServer(router_app(Router(pools.urls(p), policy=p,
                                                 kvstore=pools.kvstore))).start()
               for p in POLICIES}

    async def together() -> list[list[dict[str, float]]]:
        return list(await asyncio.gather(*(drive(routers[p].url, reqs[p]) for p in POLICIES)))

    try:
        results = dict(zip(POLICIES, asyncio.run(together()), strict=True))
        stats = {p: httpx.get(f"{routers[p].url}/stats").json() for p in POLICIES}
    finally:
        for r in routers.values():
            r.stop()
    return {p: summarize(results[p], stats[p], calib) for p in POLICIES}


def summarize(res: list[dict[str, float]], st: dict[str, Any],
              calib: dict[str, float]) -> dict[str, float]:
    ttft = np.array([r["ttft"] for r in res])
    itl = np.array([r["itl"] for r in res])
    wall = max(r["end"] for r in res)
    good = sum(1 for t, i in zip(ttft, itl, strict=True)
               if t <= calib["ttft_target_s"] and i <= calib["itl_target_s"])
    busiest = max(w["routed"] for w in st["workers"].values()) / max(1, st["requests"])
    # the rates the cost model priced with at the end (medians over the workers): its overlap
    # credit per kvstore block is 1 - P/L of a local one, its weight per decoding request P/D
    rates = {k: [r for w in st["workers"].values() if (r := (w["rates"] or {}).get(k))]
             for k in RATE_KEYS}
    measured = {f"{k.split('_')[0]}_rate": float(np.median(v)) if v else float("nan")
                for k, v in rates.items()}
    return {"ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
            "itl_p50": float(np.percentile(itl, 50)),
            "tokens_per_s": sum(r["tokens"] for r in res) / wall,
            "hit_rate": float(st["prefix_hit_rate"]), "goodput": good / wall,
            "good_fraction": good / len(res), "requests": len(res),
            "busiest_worker_share": busiest,
            # where TTFT went (medians over requests): waiting for the worker's batch,
            # loading from kvstore, prefill in the batch, and HTTP/router/event loops
            **{f"{k}_p50": float(np.median([r[k] for r in res]))
               for k in ("queue_s", "load_s", "prefill_s", "overhead_s")},
            "queue_mean": float(np.mean([r["queue_s"] for r in res])), **measured,
            "computed_mean": float(np.mean([r["computed"] for r in res]))}


METRICS = (("TTFT p50", "ttft_p50", "s", False), ("goodput", "goodput", "requests/s", True),
           ("prefix hit rate", "hit_rate", "fraction", True),
           ("TTFT p99", "ttft_p99", "s", False), ("ITL p50", "itl_p50", "s", False),
           ("throughput", "tokens_per_s", "tokens/s", True))
# ratio targets of KV-aware against each baseline: >= 1.3x round-robin on TTFT p50
# and goodput, better than every other policy there, never below round-robin on hit rate
TARGETS = {("ttft_p50", "round-robin"): 1.3, ("goodput", "round-robin"): 1.3,
           ("ttft_p50", "least-loaded"): 1.0, ("goodput", "least-loaded"): 1.0,
           ("ttft_p50", "session"): 1.0, ("goodput", "session"): 1.0,
           ("hit_rate", "round-robin"): 1.0}


def bench_routing(model: Path, quick: bool, tmp: Path, vocab: int) -> list[dict[str, Any]]:
    from common import row

    from kvstore.testing.server import ServerProc

    reps = 1 if quick else 3
    cfg = workload(vocab)
    results: dict[tuple[str, bool], list[dict[str, float]]] = {
        (p, s): [] for s in (False, True) for p in POLICIES}
    server = ServerProc(tmp / "kv-routing", host_capacity="512MiB").start()
    calib: dict[str, float] = {}
    try:
        for with_store in (False, True):
            started = time.perf_counter()
            pools = Pools(model, cfg, server.url if with_store else None)
            print(f"  {WORKERS * len(POLICIES)} workers (kvstore={with_store}) up in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
            try:
                sizes = warm(pools, cfg)
                if not with_store:  # the targets and the traffic, once for both phases
                    calib = {**sizes, **unloaded(pools, cfg, sizes),
                             **capacity(pools, cfg, sizes)}
                    cfg = sized(cfg, calib, 8.0 if quick else 25.0)
                    print(f"  calibration: {calib}; {cfg.sessions} sessions at "
                          f"{cfg.session_rate:.2f}/s", flush=True)
                for rep in range(reps):
                    reqs = {p: generate(dataclasses.replace(cfg, seed=rep, salt=1 + i + 10 * rep
                                                            + 100 * with_store))
                            for i, p in enumerate(POLICIES)}
                    # the same shapes for every policy: one bound per repetition
                    bounds = {"reuse_bound": reuse_bound(reqs["kv"], BLOCK),
                              "one_worker_hit_rate": one_worker_hit_rate(reqs["kv"],
                                                                         pools.num_blocks)}
                    for policy, res in run_all(pools, reqs, calib).items():
                        res.update(bounds)
                        results[(policy, with_store)].append(res)
                        print(f"  rep {rep} {policy:>12} kvstore={with_store!s:5}: "
                              + " ".join(f"{k}={v:.4g}" for k, v in res.items()), flush=True)
            finally:
                pools.stop()
    finally:
        server.stop()
    print_table(results, reps)

    def med(config: tuple[str, bool], key: str) -> float:
        return statistics.median(r[key] for r in results[config])

    def worst(key: str, base: str, with_store: bool, higher: bool) -> float:
        """KV-aware's worst ratio against ``base`` over the repetitions (higher is better)."""
        ratios = [(k[key] / b[key] if higher else b[key] / k[key]) if k[key] else 0.0
                  for k, b in zip(results[("kv", with_store)], results[(base, with_store)],
                                  strict=True)]
        return min(ratios)

    rows = []
    for with_store in (False, True):
        tag = ", with kvstore" if with_store else ""
        for name, key, unit, higher in METRICS:
            for base in POLICIES[:-1]:
                target = TARGETS.get((key, base))
                if target is None and base != "round-robin":
                    continue
                rows.append(row(f"routing {name}, KV-aware{tag}", unit,
                                med(("kv", with_store), key), f"{base}{tag}",
                                med((base, with_store), key),
                                higher_is_better=higher, target=target,
                                worst_rep_ratio=worst(key, base, with_store, higher)))
    fleet = [r["hit_rate"] / r["one_worker_hit_rate"] for r in results[("kv", True)]]
    rows.append(row("routing fleet hit rate, KV-aware with kvstore", "fraction",
                    med(("kv", True), "hit_rate"), "one worker's cache, all the traffic",
                    med(("kv", True), "one_worker_hit_rate"), higher_is_better=True,
                    target=1.0, worst_rep_ratio=min(fleet)))
    for key in ("ttft_target_s", "itl_target_s"):
        rows.append(row(f"routing goodput target {key[:-9]}", "s", calib[key],
                        higher_is_better=False))
    rows.append(row("routing hit rate bound (one cache, never evicts)", "fraction",
                    med(("kv", True), "reuse_bound"), higher_is_better=True))
    return rows


def print_table(results: dict[tuple[str, bool], list[dict[str, float]]], reps: int) -> None:
    """Every policy and pool, medians over the repetitions."""
    keys = [k for _, k, _, _ in METRICS] + ["good_fraction", "busiest_worker_share",
                                             "reuse_bound", "one_worker_hit_rate"]
    parts = ["queue_s_p50", "queue_mean", "load_s_p50", "prefill_s_p50", "overhead_s_p50",
             "computed_mean", "prefill_rate", "decode_rate", "load_rate"]
    print(f"\nrouting, medians of {reps} repetition(s)")
    for names in (keys, parts):
        print(f"{'policy':<13} {'kvstore':<8}" + "".join(f"{k:>15.15}" for k in names))
        for (policy, with_store), runs in results.items():
            vals = [statistics.median(r[k] for r in runs) for k in names]
            print(f"{policy:<13} {with_store!s:<8}" + "".join(f"{v:>15.4g}" for v in vals))
    print()
