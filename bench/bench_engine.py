"""The built-in decoder engine: KV-aware vs round-robin routing, TTFT with kvstore reuse, our
decoder vs transformers, block copy kernels.

Rows (each a ratio against a baseline measured in the same run, BENCH.md):
- routing: a multi-tenant multi-turn chat (shared system prompt per tenant, histories that
  grow by each answer) through the router to 2 workers, KV-aware vs round-robin, without and
  with a ``kvstore serve`` behind the workers: prefix hit rate (tokens not computed, local or
  from kvstore), client TTFT p50/p99, output tokens/s. Workers and router are served over
  loopback HTTP from threads of this process (several processes would not fit a 2-core
  machine); the kvstore server is a real process;
- TTFT of a long shared prefix on a fresh engine, loading the prefix from a ``kvstore serve``
  process vs recomputing it;
- decode tokens/s of our engine vs ``transformers``' ``generate`` (same checkpoint, greedy,
  batch 1 and batch 8), and whether their greedy tokens agree (``tokens_match``: the
  checkpoint is random, so a near-tie may flip a token; the tests check agreement on a
  checkpoint with well separated logits);
- block gather/scatter GB/s of the CPU kernels vs a plain memcpy of the same bytes.

``--quick`` runs every row in about a minute on small sizes; ``--json PATH`` writes the report;
``--device cuda`` runs the decode and TTFT sections on the GPU (transformers too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import interleaved, report, row

from engines.decoder import kernels
from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.store_io import RemoteStore
from engines.tiny_model import llama_config, write_checkpoint
from engines.worker import create_app as worker_app
from kvstore.testing.engines import ThreadServer

VOCAB = 512


def make_model(path: Path, quick: bool) -> Path:
    size = dict(hidden=128, intermediate=344, layers=2, heads=4) if quick else dict(
        hidden=256, intermediate=688, layers=4, heads=8)
    cfg = llama_config(vocab=VOCAB, kv_heads=2, max_position_embeddings=8192, **size)
    return write_checkpoint(path, cfg, seed=0)


# -- decoder vs transformers -----------------------------------------------------------------
def bench_decode(model: Path, quick: bool, device: str = "cpu") -> list[dict[str, Any]]:
    from transformers import LlamaForCausalLM

    new, plen = (8, 32) if quick else (64, 64)
    reps = 1 if quick else 5
    hf = LlamaForCausalLM.from_pretrained(model, dtype=torch.float32).to(device).eval()
    engine = Engine(model, EngineConfig(block_size=16, num_blocks=256, max_batch_tokens=1024,
                                        device=device))
    rows = []
    for batch in (1, 8):
        rng = random.Random(batch)
        prompts = [[rng.randrange(VOCAB) for _ in range(plen)] for _ in range(batch)]
        params = SamplingParams(max_tokens=new, ignore_eos=True)

        def ours(prompts: list[list[int]] = prompts, params: SamplingParams = params) -> None:
            engine.reset_prefix_cache()  # no reuse across repetitions: measure the decoder
            engine.generate(prompts, params)

        ids = torch.tensor(prompts, device=device)

        def theirs(ids: torch.Tensor = ids) -> list[list[int]]:
            with torch.no_grad():
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                  min_new_tokens=new, do_sample=False, pad_token_id=0)
            return out[:, ids.shape[1]:].tolist()  # to the host: the GPU has finished

        t_ours, t_hf = interleaved([ours, theirs], reps, warmup=1)
        engine.reset_prefix_cache()
        match = engine.generate(prompts, params) == theirs()
        toks = batch * new
        rows.append(row(f"decode tokens/s, batch {batch}", "tokens/s", toks / t_ours,
                        "transformers generate", toks / t_hf, higher_is_better=True,
                        prompt_tokens=plen, new_tokens=new, device=device,
                        tokens_match=match))
    return rows


# -- TTFT with kvstore reuse -----------------------------------------------------------------
def bench_ttft_reuse(model: Path, quick: bool, tmp: Path,
                     device: str = "cpu") -> list[dict[str, Any]]:
    from kvstore.testing.server import ServerProc

    prefix_len = 512 if quick else 2048
    reps = 2 if quick else 7
    rng = random.Random(7)
    prefix = [rng.randrange(VOCAB) for _ in range(prefix_len)]
    ecfg = EngineConfig(block_size=16, num_blocks=prefix_len // 16 + 16,
                        max_batch_tokens=prefix_len + 64, device=device)
    server = ServerProc(tmp / "kv", host_capacity="512MiB").start()
    try:
        store = RemoteStore(server.url)
        with_store = Engine(model, ecfg, store)
        without = Engine(model, ecfg)
        with_store.generate([prefix + [1]], SamplingParams(max_tokens=1))  # fills kvstore
        ttft: dict[str, float] = {}

        def first_token(engine: Engine, key: str) -> None:
            engine.reset_prefix_cache()  # a fresh worker: nothing resident
            seq = engine.add_request(prefix + [rng.randrange(VOCAB) for _ in range(8)],
                                     SamplingParams(max_tokens=1))
            while engine.has_work():
                engine.step()
            assert seq.first_token_at is not None
            ttft[key] = seq.first_token_at - seq.arrival

        samples: dict[str, list[float]] = {"reuse": [], "recompute": []}
        for i in range(reps + 1):
            first_token(with_store, "reuse")
            first_token(without, "recompute")
            if i:  # the first round is warm-up
                for k in samples:
                    samples[k].append(ttft[k])
        hit = with_store.stats()["kvstore"]["loaded_blocks"]
        store.close()
    finally:
        server.stop()
    reuse, recompute = (statistics.median(samples[k]) for k in ("reuse", "recompute"))
    return [row(f"TTFT, {prefix_len}-token shared prefix + 8", "s", reuse,
                "recompute prefix", recompute, higher_is_better=False,
                loaded_blocks=hit, block_bytes=with_store.block_bytes, device=device)]


# -- routing -------------------------------------------------------------------------------
def chat_workload(seed: int, quick: bool, salt: int) -> list[list[list[int]]]:
    """Conversations, each a system prompt then user messages; tenants share the system
    prompt. ``seed`` fixes the shape (lengths, order), ``salt`` the token values, so that runs
    compared with each other do the same work without reusing each other's prefixes."""
    shape, toks = random.Random(seed), random.Random(f"{seed}/{salt}")
    tenants, users, turns = (4, 2, 2) if quick else (6, 3, 4)
    sys_len = 128 if quick else 384
    convs = []
    for _ in range(tenants):
        system = [toks.randrange(VOCAB) for _ in range(sys_len)]
        for _ in range(users):
            msgs = [[toks.randrange(VOCAB) for _ in range(shape.randrange(8, 24))]
                    for _ in range(turns)]
            convs.append([system, *msgs])
    shape.shuffle(convs)
    return convs


async def run_chat(url: str, convs: list[list[list[int]]], max_tokens: int,
                   concurrency: int) -> dict[str, float]:
    ttfts: list[float] = []
    out_tokens = 0
    sem = asyncio.Semaphore(concurrency)

    async def conversation(client: httpx.AsyncClient, conv: list[list[int]]) -> None:
        nonlocal out_tokens
        history = list(conv[0])
        for msg in conv[1:]:
            history += msg
            body = {"prompt": history, "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            async with sem:
                start = time.perf_counter()
                first = None
                answer: list[int] = []
                async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        ids = json.loads(line[6:])["choices"][0]["token_ids"]
                        if ids and first is None:
                            first = time.perf_counter() - start
                        answer += ids
            assert first is not None, "no token streamed"
            ttfts.append(first)
            out_tokens += len(answer)
            history += answer

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(conversation(client, c) for c in convs))
    wall = time.perf_counter() - start
    ttfts.sort()
    return {"ttft_p50": float(np.percentile(ttfts, 50)), "ttft_p99": float(
        np.percentile(ttfts, 99)), "tokens_per_s": out_tokens / wall}


def bench_routing(model: Path, quick: bool, tmp: Path) -> list[dict[str, Any]]:
    from kvstore.testing.server import ServerProc

    reps = 1 if quick else 3
    ecfg = EngineConfig(block_size=16, num_blocks=48 if quick else 96, max_batch_tokens=512)
    server = ServerProc(tmp / "kv-routing", host_capacity="256MiB").start()
    stores = [RemoteStore(server.url) for _ in range(2)]
    pools = {False: [ThreadServer(worker_app(Engine(model, ecfg))).start() for _ in range(2)],
             True: [ThreadServer(worker_app(Engine(model, ecfg, st))).start() for st in stores]}
    configs = [("round-robin", False), ("kv", False), ("round-robin", True), ("kv", True)]
    results: dict[tuple[str, bool], list[dict[str, float]]] = {c: [] for c in configs}
    try:
        for rep in range(reps):
            for salt, (policy, with_store) in enumerate(configs):  # A B C D A B C D
                convs = chat_workload(rep, quick, salt)
                urls = [w.url for w in pools[with_store]]
                router = ThreadServer(router_app(Router(urls, policy=policy))).start()
                try:
                    res = asyncio.run(run_chat(router.url, convs, 8, 4 if quick else 8))
                    st = httpx.get(f"{router.url}/stats").json()
                finally:
                    router.stop()
                res["hit_rate"] = st["prefix_hit_rate"]
                results[(policy, with_store)].append(res)
                print(f"  routing rep {rep} {policy} kvstore={with_store}: {res}", flush=True)
    finally:
        for pool in pools.values():
            for w in pool:
                w.stop()
        for st in stores:
            st.close()
        server.stop()

    def med(config: tuple[str, bool], key: str) -> float:
        return statistics.median(r[key] for r in results[config])

    metrics = [("prefix hit rate", "hit_rate", "fraction", True),
               ("TTFT p50", "ttft_p50", "s", False), ("TTFT p99", "ttft_p99", "s", False),
               ("throughput", "tokens_per_s", "tokens/s", True)]
    rows = []
    for with_store in (False, True):
        tag = ", with kvstore" if with_store else ""
        for name, key, unit, higher in metrics:
            rows.append(row(f"routing {name}, KV-aware{tag}", unit, med(("kv", with_store), key),
                            f"round-robin{tag}", med(("round-robin", with_store), key),
                            higher_is_better=higher))
    for name, key, unit, higher in metrics[:2]:
        rows.append(row(f"routing {name}, round-robin with kvstore", unit,
                        med(("round-robin", True), key), "round-robin without kvstore",
                        med(("round-robin", False), key), higher_is_better=higher))
    return rows


# -- kernels -------------------------------------------------------------------------------
def bench_kernels(quick: bool) -> list[dict[str, Any]]:
    cache = torch.randn(128, 8, 2, 16, 8, 64)  # 128 blocks of 512 KiB (a 8-layer GQA model)
    ids = list(range(0, 128, 2))
    nbytes = len(ids) * kernels.block_nbytes(cache)
    src = cache.view(torch.uint8).reshape(128, -1).numpy()
    data = [bytes(b) for b in kernels.gather_blocks(cache, ids)]
    reps = 5 if quick else 15

    def memcpy() -> None:
        out = np.empty((len(ids), src.shape[1]), np.uint8)
        np.copyto(out, src[:len(ids)])

    def gather(backend: str) -> Any:
        return lambda: (kernels.set_backend(backend), kernels.gather_blocks(cache, ids))

    def scatter(backend: str) -> Any:
        return lambda: (kernels.set_backend(backend), kernels.scatter_blocks(cache, ids, data))

    cases = [memcpy, gather("numpy"), gather("numba"), scatter("numpy"), scatter("numba")]
    times = interleaved(cases, reps, warmup=1)
    kernels.set_backend("numpy")
    gbs = [nbytes / t / 1e9 for t in times]
    names = ["gather numpy", "gather numba", "scatter numpy", "scatter numba"]
    return [row(f"block {n}", "GB/s", g, "memcpy into a fresh buffer", gbs[0],
                higher_is_better=True, blocks=len(ids))
            for n, g in zip(names, gbs[1:], strict=True)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--only", default="kernels,decode,ttft,routing",
                   help="comma-separated sections to run")
    p.add_argument("--device", default="cpu", help="torch device of the decode and TTFT runs")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    torch.set_num_threads(1)  # the machine is shared; one thread per engine keeps runs stable
    sections = set(args.only.split(","))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = make_model(tmp / "model", args.quick)
        if "kernels" in sections:
            print("kernels...", flush=True)
            rows += bench_kernels(args.quick)
        if "decode" in sections:
            print("decoder vs transformers...", flush=True)
            rows += bench_decode(model, args.quick, args.device)
        if "ttft" in sections:
            print("TTFT with kvstore reuse...", flush=True)
            rows += bench_ttft_reuse(model, args.quick, tmp, args.device)
        if "routing" in sections:
            print("routing...", flush=True)
            rows += bench_routing(model, args.quick, tmp)
    report("engine", rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
