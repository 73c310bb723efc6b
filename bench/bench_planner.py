"""Does the SLO planner (``kvstore-planner``) hold more requests to their latency targets than
the best fixed prefill/decode split, on traffic that shifts from long prompts / short outputs
to short prompts / long outputs?

One fleet (a ``kvstore serve`` process, 4 workers and the router, served over loopback HTTP
from threads of this process: 4 processes would not fit a 2-core machine) replays one seeded
two-phase trace (:func:`two_phase_trace`, open loop: requests leave at their arrival times
whatever the fleet's state) once per fixed split (1, 2 and 3 prefill workers out of 4, set with
``POST /admin/role``) and once with the planner, which starts at 2 + 2 and moves workers as it
sees fit. Each run's prompts are fresh token ids of the same lengths, so no run reuses another's
blocks. Targets come from the same run: TTFT and ITL of lone requests on the idle fleet, times
a slack factor. Goodput is requests per second that met both targets (client-side TTFT to the
first token, mean inter-token gap after it).

Row: the planner's goodput against the best fixed split's (ratio, target > 1). The other rows
show each split's goodput against that same best split. ``--plot`` draws pool sizes and
latency over time in the planner's run.

Limits: every worker shares the same 2 cores, so a worker moved between pools brings its batch
slots and queue (``max_seqs``, ``max_batch_tokens``) but not more compute, unlike a GPU. Worse,
two prefill workers computing at once share the cores (processor sharing), so each prompt
takes about twice as long: on this machine a *larger* prefill pool has the *higher* TTFT, the
opposite of a fleet where each worker owns its accelerator, and the planner (which adds
workers to the pool over target) loses to the best fixed split. The timeline of its moves and
judgements is in the JSON (``timeline``) to show what it saw. ``bench/bench_planner_sim.py``
asks the same question of simulated fleets of 16 and 32 workers, where each worker has its
own compute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import report, row

from engines.access import bearer
from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.simulator.shift import Arrival, two_phase_trace
from engines.store_io import open_store
from engines.testing import ThreadServer
from engines.tiny_model import llama_config, write_checkpoint
from engines.worker import create_app as worker_app
from kvstore.testing.proc import console_script
from kvstore.testing.server import ServerProc

VOCAB = 512
WORKERS = 4
# small batches per worker: a worker moved between pools brings its batch slots, the one
# capacity that 4 workers sharing 2 cores do not share
ECFG = EngineConfig(block_size=16, num_blocks=512, max_batch_tokens=64, max_seqs=2)
TOKEN = "bench-planner-token"


class Result(NamedTuple):
    arrival: Arrival
    ok: bool
    ttft_s: float
    itl_s: float | None


async def one(client: httpx.AsyncClient, url: str, a: Arrival, prompt: list[int],
              t0: float) -> Result:
    await asyncio.sleep(max(0.0, t0 + a.t - time.perf_counter()))
    sent = time.perf_counter()
    stamps: list[float] = []
    try:
        async with client.stream("POST", f"{url}/v1/completions", json={
                "prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}) as r:
            if r.status_code != 200:
                return Result(a, False, float("inf"), None)
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                for c in doc.get("choices", []):
                    stamps += [time.perf_counter()] * len(c.get("token_ids") or [])
    except httpx.HTTPError:
        return Result(a, False, float("inf"), None)
    if not stamps:
        return Result(a, False, float("inf"), None)
    itl = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None
    return Result(a, True, stamps[0] - sent, itl)


async def replay(url: str, trace: list[Arrival], salt: int) -> list[Result]:
    rng = random.Random(salt)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(a.prompt_len)] for a in trace]
    async with httpx.AsyncClient(timeout=300) as client:
        t0 = time.perf_counter() + 0.2
        return list(await asyncio.gather(*(one(client, url, a, p, t0)
                                           for a, p in zip(trace, prompts, strict=True))))


def set_split(workers: list[str], router: str, n_prefill: int) -> None:
    want = {u: ("prefill" if i < n_prefill else "decode") for i, u in enumerate(workers)}
    for u, role in want.items():
        httpx.post(f"{u}/admin/role", json={"role": role}, headers=bearer(TOKEN),
                   timeout=30).raise_for_status()
    deadline = time.monotonic() + 30
    while {u: d["role"] for u, d in httpx.get(f"{router}/stats").json()["workers"].items()} \
            != want:
        if time.monotonic() > deadline:
            raise RuntimeError("the router did not learn the split")
        time.sleep(0.1)


def summarize(results: list[Result], ttft_t: float, itl_t: float,
              duration_s: float) -> dict[str, Any]:
    good = [r for r in results if r.ok and r.ttft_s <= ttft_t
            and (r.itl_s is None or r.itl_s <= itl_t)]
    ttfts = sorted(r.ttft_s for r in results if r.ok)
    itls = [r.itl_s for r in results if r.ok and r.itl_s is not None]
    return {"goodput": len(good) / duration_s, "good_fraction": len(good) / len(results),
            "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
            "ttft_p99_s": ttfts[int(0.99 * (len(ttfts) - 1))] if ttfts else None,
            "itl_p50_s": statistics.median(itls) if itls else None,
            "failed": sum(not r.ok for r in results)}


def make_model(path: Path) -> Path:
    cfg = llama_config(vocab=VOCAB, hidden=128, intermediate=344, layers=2, heads=4,
                       kv_heads=2, max_position_embeddings=4096)
    return write_checkpoint(path, cfg, seed=0)


def calibrate(router: str) -> tuple[float, float]:
    """Lone TTFT of a long prompt and lone ITL of a long output on the idle 2 + 2 fleet."""
    ttfts, itls = [], []
    for i in range(2):
        res = asyncio.run(replay(router, [Arrival(0, 384, 4, "A"), Arrival(0.5, 16, 48, "B")],
                                 salt=10_000 + i))
        ttfts.append(res[0].ttft_s)
        itls.append(res[1].itl_s or 0.0)
    return statistics.median(ttfts), statistics.median(itls)


def capacity(router: str, prompt_len: int, max_tokens: int, seconds: float,
             clients: int = 12) -> float:
    """Requests per second the 2 + 2 fleet completes of one shape, ``clients`` at a time
    (closed loop): what the machine really sustains, all workers sharing its cores."""
    shape = Arrival(0, prompt_len, max_tokens, "-")

    async def loop(client: httpx.AsyncClient, k: int, end: float) -> int:
        rng, done = random.Random(20_000 + k), 0
        while time.perf_counter() < end:
            res = await one(client, router, shape,
                            [rng.randrange(3, VOCAB) for _ in range(prompt_len)], 0.0)
            done += res.ok
        return done

    async def go() -> int:
        async with httpx.AsyncClient(timeout=300) as client:
            end = time.perf_counter() + seconds
            return sum(await asyncio.gather(*(loop(client, k, end) for k in range(clients))))

    started = time.perf_counter()
    n = asyncio.run(go())
    return n / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short trace, one repetition")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the JSON report")
    ap.add_argument("--plot", default=None, metavar="PATH", help="write a PNG")
    ap.add_argument("--seed", type=int, default=1, help="trace seed")
    ap.add_argument("--slack", type=float, default=4.0,
                    help="targets are the lone request's TTFT and ITL times this")
    ap.add_argument("--load", type=float, default=1.0,
                    help="arrival rate of each phase as a fraction of what the even split "
                         "sustains of it")
    args = ap.parse_args()
    torch.set_num_threads(1)
    duration = 16.0 if args.quick else 60.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-planner-"))
    model = make_model(tmp / "model")
    store = ServerProc(tmp / "kv", host_capacity="512MiB").start()
    # the workers' token: their admin route (role switches, the planner's) needs one
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    workers = [ThreadServer(worker_app(Engine(model, ECFG, open_store(store.url)),
                                       role="prefill" if i < 2 else "decode",
                                       token=TOKEN)).start()
               for i in range(WORKERS)]
    urls = [w.url for w in workers]
    router = ThreadServer(router_app(Router(urls[2:], prefill_workers=urls[:2],
                                            kvstore=store.url, worker_token=TOKEN))).start()
    try:
        set_split(urls, router.url, 2)
        lone_ttft, lone_itl = calibrate(router.url)
        ttft_t, itl_t = args.slack * lone_ttft, args.slack * lone_itl
        # each phase arrives at what the even split sustains of its shape when saturated
        # (measured here): too much for 2 workers in the busy pool, so each phase wants 3
        seconds = 3.0 if args.quick else 6.0
        rate_a = args.load * capacity(router.url, 384, 4, seconds)
        rate_b = args.load * capacity(router.url, 16, 48, seconds)
        trace = two_phase_trace(args.seed, duration, rate_a, rate_b)
        print(f"lone TTFT {lone_ttft * 1000:.0f} ms, ITL {lone_itl * 1000:.1f} ms; targets "
              f"{ttft_t * 1000:.0f} / {itl_t * 1000:.1f} ms; {len(trace)} requests "
              f"({rate_a:.1f}/s then {rate_b:.1f}/s) over {duration:.0f} s", flush=True)
        runs: dict[str, dict[str, Any]] = {}
        for n_pre in (1, 2, 3):
            set_split(urls, router.url, n_pre)
            res = asyncio.run(replay(router.url, trace, salt=n_pre))
            runs[f"static {n_pre}P+{WORKERS - n_pre}D"] = summarize(res, ttft_t, itl_t,
                                                                    duration)
            print(f"static {n_pre}P: {runs[f'static {n_pre}P+{WORKERS - n_pre}D']}",
                  flush=True)
        set_split(urls, router.url, 2)
        # the planner as it is deployed: its own process beside the router
        log = tmp / "planner.jsonl"
        with log.open("w") as out:
            planner = subprocess.Popen(
                [*console_script("kvstore-planner", "engines.planner.cli"), "--router",
                 router.url, "--token-file", str(token_file), "--ttft-target-s",
                 f"{ttft_t:.4f}", "--itl-target-s", f"{itl_t:.5f}", "--window-s", "2",
                 "--min-samples", "3", "--interval-s", "0.5", "--patience", "2",
                 "--cooldown-s", "2", "--max-queue", "2", "--log-ticks"], stdout=out)
            try:
                time.sleep(3)  # its first judgement (it imports in a second or two)
                wall0 = time.time() + 0.2  # the trace's time 0 (see replay)
                res = asyncio.run(replay(router.url, trace, salt=4))
            finally:
                planner.terminate()
                planner.wait(timeout=30)
        runs["planner"] = summarize(res, ttft_t, itl_t, duration)
        print(f"planner: {runs['planner']}", flush=True)
        events = [{**e, "t": e["at"] - wall0} for e in map(json.loads, log.read_text()
                                                                .splitlines())]
    finally:
        router.stop()
        for w in workers:
            w.stop()
        store.stop()
    best = max((k for k in runs if k.startswith("static")), key=lambda k: runs[k]["goodput"])
    rows = [row(f"goodput, {k}", "req/s", v["goodput"], best, runs[best]["goodput"],
                higher_is_better=True, target=1.0 if k == "planner" else None,
                **{x: (round(y, 4) if isinstance(y, float) else y) for x, y in v.items()
                   if x != "goodput"})
            for k, v in runs.items()]
    rows[-1]["moves"] = sum(e["event"] == "move" for e in events)
    report("planner", rows, args.json)
    if args.json:  # the planner's judgements and moves, for a later look
        doc = json.loads(Path(args.json).read_text())
        Path(args.json).write_text(json.dumps({**doc, "targets_s": {"ttft": ttft_t,
                                               "itl": itl_t}, "timeline": events}, indent=1))
    if args.plot:
        plot(args.plot, events, res, ttft_t, itl_t, duration)


def plot(path: str, events: list[dict[str, Any]], res: list[Result], ttft_t: float,
         itl_t: float, duration: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ticks = [e for e in events if e["event"] == "tick"]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    t = [e["t"] for e in ticks]
    for pool in ("prefill", "decode"):
        ax1.step(t, [e[pool]["workers"] for e in ticks], where="post", label=pool)
    ax1.set_ylabel("workers")
    ax1.legend()
    ax1.set_title("planner run: pool sizes, client TTFT and ITL over time")
    ok = [r for r in res if r.ok]
    ax2.scatter([r.arrival.t for r in ok], [r.ttft_s for r in ok], s=6)
    ax2.axhline(ttft_t, color="red", lw=1, label="target")
    ax2.set_ylabel("TTFT (s)")
    ax2.set_yscale("log")
    ax2.legend()
    with_itl = [r for r in ok if r.itl_s is not None]
    ax3.scatter([r.arrival.t for r in with_itl], [r.itl_s for r in with_itl], s=6)
    ax3.axhline(itl_t, color="red", lw=1)
    ax3.set_ylabel("ITL (s)")
    ax3.set_yscale("log")
    ax3.set_xlabel("seconds (arrival); phase B from %.0f s" % (duration / 2))
    for ax in (ax1, ax2, ax3):
        ax.axvline(duration / 2, color="gray", ls="--", lw=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
