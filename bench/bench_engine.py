"""The built-in decoder engine: KV-aware routing against round-robin, least-loaded and session
affinity on realistic traffic, TTFT with kvstore reuse, our decoder vs transformers, block copy
kernels.

Rows (each a ratio against a baseline measured in the same run, as bench/common.py reports them):
- routing (:mod:`engine_routing`): generated traffic (multi-turn chats, tenants' system
  prompts, Zipf-popular RAG documents, one-off prompts; :mod:`engines.workload`) through the
  router to 4 worker processes per policy (the policies run at the same time) whose caches
  each hold a seventh of the shared prefixes, without and with a ``kvstore serve`` behind the
  workers: TTFT p50/p99, ITL p50, output tokens/s, prefix hit rate and goodput, KV-aware
  against each baseline;
- TTFT of a long shared prefix on a fresh engine, loading the prefix from a ``kvstore serve``
  process vs recomputing it;
- decode tokens/s of our engine vs ``transformers``' ``generate`` (same checkpoint, greedy,
  batch 1 and batch 8), and whether their greedy tokens agree (``tokens_match``: the
  checkpoint is random, so a near-tie may flip a token; the tests check agreement on a
  checkpoint with well separated logits);
- block gather/scatter GB/s of the CPU kernels vs a plain memcpy of the same bytes.

``--quick`` runs every row on small sizes (about a minute, plus several for the routing
section, much of it starting 32 worker processes on a shared 2-core machine); ``--json
PATH`` writes the report; ``--device cuda`` runs the decode and TTFT sections on the GPU
(transformers too).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import interleaved, report, row
from engine_routing import bench_routing

from engines.decoder import kernels
from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.store_io import RemoteStore
from engines.tiny_model import llama_config, write_checkpoint

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
        counts = with_store.stats().kvstore
        hit = counts.loaded_blocks if counts is not None else 0
        store.close()
    finally:
        server.stop()
    reuse, recompute = (statistics.median(samples[k]) for k in ("reuse", "recompute"))
    return [row(f"TTFT, {prefix_len}-token shared prefix + 8", "s", reuse,
                "recompute prefix", recompute, higher_is_better=False,
                loaded_blocks=hit, block_bytes=with_store.block_bytes, device=device)]


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
            # the larger model even with --quick: prefill must dominate time to first token
            routing_model = make_model(tmp / "routing-model", quick=False)
            rows += bench_routing(routing_model, args.quick, tmp, VOCAB)
    report("engine", rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
