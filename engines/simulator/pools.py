"""A disaggregated fleet, simulated: a prefill pool and a decode pool behind kvstore, with a
fixed split or the SLO planner moving workers between them.

A request goes as the real router sends it with prefill workers configured
(:mod:`engines.router.disagg`): the router's policy ranks the prefill pool, the chosen worker
computes the prompt and its first token (the client's time to first token) and saves the
blocks to kvstore; then the policy ranks the decode pool and the chosen worker loads the
prompt from kvstore and generates the rest. Each hop costs ``request_overhead_s``. With one
pool empty the other serves whole requests.

The planner is the real one: every ``interval_s`` its :class:`~engines.planner.policy.Policy`
judges the pools as its :class:`~engines.planner.observe.FleetView` sees them (each worker's
finished requests over the window, its queue) and a move switches the least busy donor's
role at once. A switched worker finishes what it holds; the router sends it the new role's
work from then on (the real router learns a role within a second).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from engines.planner.observe import FleetView, WorkerSeen
from engines.planner.policy import Policy
from engines.planner.settings import PlannerSettings
from engines.router.cost import CostModel
from engines.router.policies import Ask, make_policy
from engines.router.workers import Job, Worker
from engines.simulator.engine import EngineShape, SimEngine, SimSeq
from engines.simulator.rates import SimRates
from engines.simulator.shift import Arrival
from engines.simulator.store import SharedStore

ARRIVE, REACH, STEP, JUDGE = range(4)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """A disaggregated fleet: ``workers`` in all, ``prefill`` of them in the prefill pool at
    the start, and the planner's settings (None: the split stays fixed)."""

    workers: int
    prefill: int
    planner: PlannerSettings | None = None
    shape: EngineShape = field(default_factory=EngineShape)
    rates: SimRates = field(default_factory=SimRates)

    def __post_init__(self) -> None:
        if not 0 <= self.prefill <= self.workers or self.workers < 1:
            raise ValueError("need 0 <= prefill <= workers and workers >= 1")


class Served(NamedTuple):
    """One request as its client saw it (seconds from the start of the trace)."""

    arrival: Arrival
    ttft: float
    itl: float  # mean gap between its tokens after the first (0 for one token)
    end: float


class Sizes(NamedTuple):
    """Pool sizes from ``at`` on (the timeline of a run)."""

    at: float
    prefill: int
    decode: int


@dataclass(slots=True, eq=False)
class _Req:
    arrival: Arrival
    hashes: list[bytes]
    first_at: float = -1.0


class PoolFleet:
    """Serves one trace on a disaggregated fleet; :meth:`run` once."""

    def __init__(self, cfg: PoolConfig) -> None:
        self.cfg = cfg
        self.store = SharedStore(None)
        self.engines = [SimEngine(cfg.shape, cfg.rates, self.store) for _ in range(cfg.workers)]
        self.roles = ["prefill" if i < cfg.prefill else "decode" for i in range(cfg.workers)]
        self.views = [Worker(f"sim://worker{i}", known=True, rates=cfg.rates.reported())
                      for i in range(cfg.workers)]
        self.index = {id(v): i for i, v in enumerate(self.views)}
        self.policy = make_policy("kv", self.views, CostModel())
        p = cfg.planner
        self.planner = Policy(p) if p is not None else None
        self.interval_s = p.interval_s if p is not None else 0.0
        self.seen = FleetView(window_s=p.window_s if p else 8.0,
                              percentile=p.percentile if p else 90.0,
                              min_samples=p.min_samples if p else 3)
        for i, v in enumerate(self.views):
            self.seen.workers[v.url] = WorkerSeen(v.url, self.roles[i], up=True, kvstore=True)
        self.stage: dict[SimSeq, tuple[_Req, str]] = {}
        self.heap: list[tuple[float, int, int, Any]] = []
        self.order = itertools.count()
        self.seqs = itertools.count()  # numbers each stage of each request
        self.served: list[Served] = []
        self.timeline = [Sizes(0.0, cfg.prefill, cfg.workers - cfg.prefill)]
        self.moves = 0

    def run(self, trace: list[Arrival]) -> list[Served]:
        for i, a in enumerate(trace):
            bs = self.cfg.shape.block_size
            hashes = [i.to_bytes(4, "big") + b.to_bytes(4, "big")
                      for b in range(a.prompt_len // bs)]  # fresh prompts: unique blocks
            self._push(a.t, ARRIVE, _Req(a, hashes))
        left = len(trace)
        if self.planner is not None and left:
            self._push(self.interval_s, JUDGE, None)
        while self.heap:
            now, _, kind, item = heapq.heappop(self.heap)
            if kind == ARRIVE:
                self._send(item, "prefill" if self._pool("prefill") else "whole", now)
            elif kind == REACH:
                w, seq = item
                self._reach(w, seq, now)
            elif kind == STEP:
                w, version = item
                if version == self.engines[w].version:
                    left -= self._finish(w, now)
            elif left:
                self._judge(now)
                self._push(now + self.interval_s, JUDGE, None)
        return self.served

    # -- routing -----------------------------------------------------------------------------
    def _pool(self, role: str) -> list[Worker]:
        return [v for v, r in zip(self.views, self.roles, strict=True) if r == role]

    def _send(self, req: _Req, stage: str, now: float) -> None:
        """Route ``req``'s ``stage`` (``prefill``: the prompt and first token; ``decode``: the
        rest, loaded from kvstore; ``whole``: both, when a pool is empty) as the router does."""
        a, bs = req.arrival, self.cfg.shape.block_size
        pool = self._pool("decode" if stage != "prefill" else "prefill") or self.views
        tokens = 1 if stage == "prefill" else max(1, a.max_tokens - (stage == "decode"))
        stored = self.store.lookup(req.hashes, touch=False) if self.policy.uses_store else 0
        view = self.policy.rank(pool, Ask(req.hashes, a.prompt_len, tokens, "", stored, bs))[0]
        hit = max(view.local_prefix(req.hashes), stored)
        job = Job(a.prompt_len + tokens, a.prompt_len - bs * hit, req.hashes)
        view.begin(job)
        view.routed += 1
        seq = SimSeq(next(self.seqs), a.prompt_len, tokens, req.hashes, now, job)
        self.stage[seq] = (req, stage)
        self._push(now + self.cfg.rates.request_overhead_s, REACH, (self.index[id(view)], seq))

    def _reach(self, w: int, seq: SimSeq, now: float) -> None:
        engine = self.engines[w]
        engine.add(seq)
        self.seen.workers[self.views[w].url].waiting = len(engine.waiting)
        step = engine.start(now) or engine.cut(now)
        if step is not None:
            self._push(step.end, STEP, (w, engine.version))

    def _finish(self, w: int, now: float) -> int:
        """Apply worker ``w``'s step; how many requests ended for their clients."""
        engine, view = self.engines[w], self.views[w]
        seen = self.seen.workers[view.url]
        firsts, ended = engine.finish(now)
        for seq in firsts:
            view.first_token(seq.job)
        done = 0
        for seq in ended:
            view.end(seq.job)
            req, stage = self.stage.pop(seq)
            if stage != "decode":
                req.first_at = seq.first_at
            itl = (seq.last_at - seq.first_at) / (seq.produced - 1) if seq.produced > 1 else None
            kind = "prefill" if stage == "prefill" else "generate"
            seen.samples.append((now, kind, seq.first_at - seq.sent, itl, seq.produced))
            if stage == "prefill" and req.arrival.max_tokens > 1:
                self._send(req, "decode", now)
                continue
            a = req.arrival
            gaps = a.max_tokens - 1
            self.served.append(Served(a, req.first_at - a.t,
                                      (seq.last_at - req.first_at) / gaps if gaps else 0.0,
                                      seq.last_at))
            done += 1
        step = engine.start(now)
        if step is not None:
            self._push(step.end, STEP, (w, engine.version))
        seen.waiting = len(engine.waiting)
        seen.inflight = len(engine.running)
        return done

    # -- planning ----------------------------------------------------------------------------
    def _judge(self, now: float) -> None:
        assert self.planner is not None
        pools = self.seen.pools(now)
        action = self.planner.decide(pools, now)
        if action is None or action.kind != "move" or action.donor is None:
            return
        url = self.seen.donor(action.donor, action.pool)
        if url is None:
            return
        w = next(i for i, v in enumerate(self.views) if v.url == url)
        self.roles[w] = action.pool
        self.seen.set_role(url, action.pool)
        self.moves += 1
        n = self.roles.count("prefill")
        self.timeline.append(Sizes(now, n, len(self.roles) - n))

    def _push(self, at: float, kind: int, item: Any) -> None:
        heapq.heappush(self.heap, (at, next(self.order), kind, item))


def serve(trace: list[Arrival], cfg: PoolConfig) -> PoolFleet:
    """Serve ``trace`` on a fresh fleet of ``cfg``; the fleet holds what happened
    (``served``, ``timeline``, ``moves``). Deterministic for the same inputs."""
    fleet = PoolFleet(cfg)
    fleet.run(trace)
    return fleet
