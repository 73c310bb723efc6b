"""A fleet of simulated workers behind the router's own policies, driven by a trace.

Routing is the real router's: each simulated worker has a router-side
:class:`~engines.router.workers.Worker` view (work in flight through ``Job``, residency,
measured rates), the live workers are rotated one place per request as
:meth:`engines.router.core.Router.rank` does, and the policy of
:func:`engines.router.policies.make_policy` (with the real
:class:`~engines.router.cost.CostModel`) ranks them; the request goes to the first. The view's
residency and rates are a copy of the worker's cache index and of the rates it measured
(:class:`engines.decoder.rates.Rates` fed by its simulated steps, as a real worker feeds
them) taken when a request ends there and every ``POLL_S`` (as the real router pulls
residency events), and ``promised`` covers the requests in flight, as in the real router.

Clients behave as ``bench/engine_routing.py``'s: a request is sent at its arrival time, a
chat turn not before its previous turn has ended; the worker sees it ``request_overhead_s``
later, and its time to first token is counted from the send.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from engines.router.cost import CostModel
from engines.router.policies import Ask, make_policy
from engines.router.workers import POLL_S, Job, Worker
from engines.simulator.engine import EngineShape, SimEngine, SimSeq
from engines.simulator.rates import SimRates
from engines.simulator.store import SharedStore
from engines.workload import Request
from kvstore.keys import BlockHasher

ARRIVE, REACH, STEP, POLL = range(4)  # event kinds (events at one instant go in push order)


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """One simulated fleet: its size, policy, kvstore and the shape and speed of a worker."""

    workers: int = 8
    policy: str = "kv"
    kvstore: bool = False
    store_blocks: int | None = None  # kvstore's capacity in blocks (None: unbounded)
    shape: EngineShape = field(default_factory=EngineShape)
    rates: SimRates = field(default_factory=SimRates)
    load_weight: float | None = None  # the router's overrides (None: measured)
    store_weight: float | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("workers must be >= 1")


class Outcome(NamedTuple):
    """One request as its client saw it (seconds from the start of the trace)."""

    request: int  # its index in the trace
    worker: int
    sent: float
    ttft: float
    itl: float  # mean gap between its tokens (0 for one token)
    tokens: int
    end: float
    prompt_tokens: int
    hit_tokens: int  # not computed: local cache or kvstore


class Fleet:
    """Routes and serves one trace; :meth:`run` once."""

    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        self.store = SharedStore(cfg.store_blocks) if cfg.kvstore else None
        self.engines = [SimEngine(cfg.shape, cfg.rates, self.store) for _ in range(cfg.workers)]
        self.views = [Worker(f"sim://worker{i}", known=True, rates=cfg.rates.reported())
                      for i in range(cfg.workers)]
        self.index = {id(v): i for i, v in enumerate(self.views)}
        cost = CostModel(load_weight=cfg.load_weight, store_weight=cfg.store_weight)
        self.policy = make_policy(cfg.policy, self.views, cost)
        self.hasher = BlockHasher("sha256", None, cfg.shape.block_size)
        self.heap: list[tuple[float, int, int, Any]] = []
        self.order = itertools.count()
        self.turn = 0
        self.outcomes: list[Outcome] = []

    def run(self, reqs: list[Request]) -> list[Outcome]:
        """Serve ``reqs`` (sorted by arrival) to the end; outcomes in the order they ended."""
        waiting_for: dict[int, list[Request]] = {}
        ended: set[int] = set()
        for r in reqs:
            self._push(r.at, ARRIVE, r)
        left = len(reqs)
        if left:
            self._push(POLL_S, POLL, None)
        while self.heap:
            now, _, kind, item = heapq.heappop(self.heap)
            if kind == ARRIVE:
                if item.after is not None and item.after not in ended:
                    waiting_for.setdefault(item.after, []).append(item)
                else:
                    self._send(item, now)
            elif kind == REACH:
                w, seq = item
                self._reach(w, seq, now)
            elif kind == STEP:
                w, version = item
                if version != self.engines[w].version:
                    continue  # cut short: a newer event stands for this step
                for seq in self._finish(w, now):
                    ended.add(seq.index)
                    left -= 1
                    for r in waiting_for.pop(seq.index, []):
                        self._send(r, now)
            elif left:  # POLL: the router's background residency pull
                for v, e in zip(self.views, self.engines, strict=True):
                    v.resident, v.rates = set(e.blocks.by_hash), e.reported_rates()
                self._push(now + POLL_S, POLL, None)
        return self.outcomes

    # -- internals ----------------------------------------------------------------------------
    def _push(self, at: float, kind: int, item: Any) -> None:
        heapq.heappush(self.heap, (at, next(self.order), kind, item))

    def _send(self, r: Request, now: float) -> None:
        """Route ``r`` as the router would, at ``now``; it reaches the worker later."""
        bs = self.cfg.shape.block_size
        hashes: list[bytes] = list(self.hasher.hash_blocks(r.prompt))
        n = len(r.prompt)
        k = self.turn % len(self.views)
        self.turn += 1
        rotated = self.views[k:] + self.views[:k]
        stored = (self.store.lookup(hashes, touch=False)
                  if self.store is not None and self.policy.uses_store else 0)
        view = self.policy.rank(rotated, Ask(hashes, n, r.max_tokens, r.session, stored, bs))[0]
        job = Job(n + r.max_tokens, n - bs * max(view.local_prefix(hashes), stored), hashes)
        view.begin(job)
        view.routed += 1
        seq = SimSeq(r.index, n, r.max_tokens, hashes, now, job)
        self._push(now + self.cfg.rates.request_overhead_s, REACH, (self.index[id(view)], seq))

    def _reach(self, w: int, seq: SimSeq, now: float) -> None:
        engine = self.engines[w]
        engine.add(seq)
        step = engine.start(now) or engine.cut(now)
        if step is not None:
            self._push(step.end, STEP, (w, engine.version))

    def _finish(self, w: int, now: float) -> list[SimSeq]:
        engine, view = self.engines[w], self.views[w]
        firsts, ended = engine.finish(now)
        for seq in firsts:
            view.first_token(seq.job)
        for seq in ended:
            view.end(seq.job)
            itl = (seq.last_at - seq.first_at) / (seq.produced - 1) if seq.produced > 1 else 0.0
            self.outcomes.append(Outcome(seq.index, w, seq.sent, seq.first_at - seq.sent, itl,
                                         seq.produced, seq.last_at, seq.prompt_len,
                                         seq.local_hit + seq.store_hit))
        if ended:  # the real router pulls residency events (and rates) when a request ends
            view.resident, view.rates = set(engine.blocks.by_hash), engine.reported_rates()
        step = engine.start(now)
        if step is not None:
            self._push(step.end, STEP, (w, engine.version))
        return ended


def simulate(reqs: list[Request], cfg: FleetConfig) -> list[Outcome]:
    """Serve ``reqs`` on a fresh fleet of ``cfg``; deterministic for the same inputs."""
    return Fleet(cfg).run(reqs)
