"""The engines of one peers-bench run and the cases they serve: no cache (also vLLM's own
prefix cache, the limit) and per store a writer and a reader engine process, driven in turn; every
answer is kept, then becomes a sample with its tokens compared with no cache's on the same prompt.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from peers_concurrent import READER_ARGS
from peers_engine import EngineProc
from peers_report import CONCURRENT, LIMIT, NONE, Sample, Samples
from peers_store import PeerStore

if TYPE_CHECKING:
    from engines.workload import Request

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

    def __init__(
        self,
        model: Path,
        stores: dict[str, PeerStore],
        logs: Path,
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        self.model, self.stores, self.logs = model, stores, logs
        self.engine_args = engine_args or {}
        self.failed: dict[str, str] = {}  # stores whose engines could not serve, and why
        self.answers: list[Answer] = []
        self.walls: dict[tuple[str, str], float] = {}  # a concurrent trace's wall seconds
        self.warm_prompt: list[int] = []
        self.none = self._engine("none", None)
        self.writers: dict[str, EngineProc] = {}
        self.readers: dict[str, EngineProc] = {}
        self.use(stores)

    def use(self, stores: dict[str, PeerStore], tag: str = "") -> None:
        """A new writer and a new reader engine per store of ``stores``, named with ``tag``;
        the previous stores' engines exit first."""
        for eng in [*self.writers.values(), *self.readers.values()]:
            eng.close()
        self.stores = stores
        self.writers = {n: self._engine(f"{n}-{tag}writer", s) for n, s in stores.items()}
        self.readers = {n: self._engine(f"{n}-{tag}reader", s) for n, s in stores.items()}

    def _engine(self, name: str, store: PeerStore | None, **engine_args: Any) -> EngineProc:
        spec: dict[str, Any] = {
            "model": str(self.model),
            "engine_args": {**self.engine_args, **engine_args},
        }
        if store is not None:
            spec["engine_args"].update(store.engine_args)
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
        self.none.wait_ready()
        for name in list(self.stores):
            self._guard(name, self.writers[name].wait_ready, self.readers[name].wait_ready)
        self.warm_prompt = tokens(rng, WARM_TOKENS)
        self.none.run(self.warm_prompt, 2)
        for name in list(self.stores):
            self._guard(name, lambda n=name: self.writers[n].run(self.warm_prompt, 2))
        time.sleep(SAVE_SETTLE_S)
        for name in list(self.stores):
            self._guard(name, lambda n=name: self.readers[n].run(self.warm_prompt, 2))

    def _guard(self, name: str, *steps: Callable[[], object]) -> None:
        """Run ``steps`` of store ``name``'s engines; if one fails (an engine that does not
        start, or dies on its first save or load), the store leaves the race with the error
        its engine printed, and its engines exit."""
        try:
            for step in steps:
                step()
        except RuntimeError as e:
            engines = [self.writers.pop(name), self.readers.pop(name)]
            self.stores = {n: s for n, s in self.stores.items() if n != name}
            self.failed[name] = next((eng.error() for eng in engines if eng.error()), str(e))
            print(f"{name} leaves the race: {self.failed[name]}", flush=True)
            for eng in engines:
                eng.close()

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
        samples = Samples(walls=dict(self.walls))
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

    def concurrent_traffic(self, trace: list[Request], concurrency: int) -> None:
        """Case 3 with ``concurrency`` requests in flight (``peers_concurrent``): each store's
        reader is replaced by one without vLLM's prefix cache, which loads the warm-up prompt
        first; then no cache, each store in turn and the limit serve the whole trace."""
        for eng in self.readers.values():
            eng.close()
        self.readers = {
            n: self._engine(f"{n}-traffic-reader", s, **READER_ARGS) for n, s in self.stores.items()
        }
        for name in list(self.stores):
            warm = [
                self.readers[name].wait_ready,
                lambda n=name: self.readers[n].run(self.warm_prompt, 2),
            ]
            self._guard(name, *warm)
        at = {r.index: i for i, r in enumerate(trace)}
        reqs = [
            {"prompt": r.prompt, "max_tokens": r.max_tokens, "after": at.get(r.after)}
            for r in trace
        ]
        passes = [(NONE, self.none, True), *((n, e, False) for n, e in self.readers.items())]
        for name, eng, skip in passes:
            print(f"traffic, {concurrency} in flight: {name}...", flush=True)
            self._trace(name, trace, eng.run_trace(reqs, concurrency, skip_cache=skip))
        self._trace(LIMIT, trace, self.none.run_trace(reqs, concurrency))

    def _trace(self, store: str, trace: list[Request], out: dict[str, Any]) -> None:
        for r, answer in zip(trace, out["results"], strict=True):
            self.answers.append(Answer(CONCURRENT, store, tuple(r.prompt), answer))
        self.walls[(CONCURRENT, store)] = out["wall"]

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

    def pressure(self, working_set: list[list[int]], rng: random.Random) -> None:
        """Case 4: every writer stores the whole working set in order, the stores interleaved
        prompt by prompt, so that each store's RAM tier holds at most its last quarter; then
        each reader serves every prompt once, in one shuffled order for all, its own cache
        reset before each, interleaved request by request with no cache."""
        names = list(self.writers)
        for i, p in enumerate(working_set):
            for name in rotate(names, i):
                self.writers[name].run(p, 1)
        time.sleep(SAVE_SETTLE_S)
        order = list(range(len(working_set)))
        rng.shuffle(order)
        for i, k in enumerate(order):
            self.measure("pressure", NONE, self.none, working_set[k])
            for name in rotate(names, i):
                self.measure("pressure", name, self.readers[name], working_set[k])


def rotate(names: list[str], i: int) -> list[str]:
    k = i % len(names) if names else 0
    return names[k:] + names[:k]
