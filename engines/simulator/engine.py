"""One simulated engine worker: the real worker's block cache and its scheduler's shape,
with step times from :class:`~engines.simulator.rates.SimRates` instead of a model.

The cache is the engine's own :class:`~engines.decoder.paged_kv.BlockManager` (reference
counts, prefix index, least recently released blocks recycled first), so a simulated worker
holds and evicts exactly the blocks a real one of the same size would. Each step mirrors
:class:`~engines.decoder.scheduler.Scheduler`: running sequences first (one token per
decoding sequence, the next chunk of an unfinished prefill), then waiting sequences join
while the token budget, sequence slots and free blocks last. A joining sequence reuses its
prompt's leading blocks from the local cache, then from kvstore (loaded, not computed); the
last prompt token is always computed. The step takes :meth:`SimRates.step_seconds` of its
prefill tokens, decoding sequences and loaded tokens; its first token comes at the end of the
step that completes the prompt, and each later step adds one token.

Simplifications, on purpose: a sequence reserves the blocks of its whole prompt and output
when it joins (no preemption: it waits instead), output blocks are never published (the
workload's later turns resend answers the model did not write, so they never match), and
kvstore saves cost nothing (the real engine saves after the step). A run of steps that only
decode is planned as one event (:attr:`Step.repeat`) and cut short when a request arrives.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from engines.decoder.paged_kv import BlockManager
from engines.decoder.rates import Rates
from engines.router.workers import Job
from engines.simulator.rates import SimRates
from engines.simulator.store import SharedStore


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The engine flags that shape its scheduling (``kvstore-engine serve``'s defaults)."""

    block_size: int = 16
    num_blocks: int = 512
    max_batch_tokens: int = 512  # prefill chunk budget per step
    max_seqs: int = 32

    def __post_init__(self) -> None:
        if min(self.block_size, self.num_blocks, self.max_batch_tokens, self.max_seqs) < 1:
            raise ValueError("block_size, num_blocks, max_batch_tokens and max_seqs must be >= 1")

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


@dataclass(slots=True, eq=False)
class SimSeq:
    """One request on a simulated engine."""

    index: int
    prompt_len: int
    max_tokens: int
    hashes: list[bytes]  # the prompt's full blocks
    sent: float  # when the client sent it
    job: Job  # what the router counts on the worker until the request ends
    table: list[int] = field(default_factory=list)
    computed: int = 0  # prompt tokens with K/V (cached, loaded or computed)
    published: int = 0  # leading prompt blocks in the local index
    produced: int = 0  # output tokens
    local_hit: int = 0
    store_hit: int = 0
    first_at: float = -1.0
    last_at: float = -1.0

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len


class Step(NamedTuple):
    """Steps in flight: ``repeat`` identical steps of ``seconds`` each from ``start``."""

    plan: list[tuple[SimSeq, int]]
    start: float
    seconds: float
    repeat: int
    prefill: int = 0  # prompt tokens each step computes
    decode: int = 0  # sequences each step decodes
    loaded: int = 0  # prompt tokens the (first) step loads from kvstore

    @property
    def end(self) -> float:
        return self.start + self.seconds * self.repeat


class SimEngine:
    """A worker's scheduler state; driven by :class:`engines.simulator.fleet.Fleet`."""

    def __init__(self, shape: EngineShape, rates: SimRates,
                 store: SharedStore | None = None) -> None:
        self.shape, self.rates, self.store = shape, rates, store
        self.blocks = BlockManager(shape.num_blocks)
        self.waiting: deque[SimSeq] = deque()
        self.running: list[SimSeq] = []
        self.step: Step | None = None
        self.version = 0  # bumped when the step in flight is cut short
        self.busy_s = 0.0
        self.steps = 0
        # what the real worker would measure and report to the router (its own rate code)
        self.measured = Rates()

    def add(self, seq: SimSeq) -> None:
        """Queue ``seq``; ``ValueError`` if it could never fit the cache."""
        if self.shape.blocks_for(seq.prompt_len + seq.max_tokens) > self.shape.num_blocks:
            raise ValueError(f"request {seq.index} needs more than {self.shape.num_blocks} "
                             "blocks: raise num_blocks")
        self.waiting.append(seq)

    def start(self, now: float) -> Step | None:
        """Plan the next step(s) from ``now`` if idle and there is work; the new step."""
        if self.step is not None or not (self.waiting or self.running):
            return None
        self.step = self._plan(now)
        return self.step

    def cut(self, now: float) -> Step | None:
        """A request arrived at ``now``: end a run of decode steps at the step in flight then,
        so the request can join the next one. The shortened step, or None if unchanged."""
        step = self.step
        if step is None or step.repeat == 1:
            return None
        done = int((now - step.start) // step.seconds) + 1
        if done >= step.repeat:
            return None
        self.step = step._replace(repeat=done)
        self.version += 1
        return self.step

    def finish(self, now: float) -> tuple[list[SimSeq], list[SimSeq]]:
        """Apply the step(s) in flight, ending at ``now``: the sequences that got their first
        token, and those that ended (their blocks released)."""
        step, self.step = self.step, None
        assert step is not None
        firsts: list[SimSeq] = []
        ended: list[SimSeq] = []
        for seq, n in step.plan:
            if seq.prefilling:
                seq.computed += n
                self._publish(seq)
                if not seq.prefilling:
                    seq.produced, seq.first_at = 1, now
                    firsts.append(seq)
            else:
                seq.produced += step.repeat
            seq.last_at = now
            if not seq.prefilling and seq.produced >= seq.max_tokens:
                ended.append(seq)
        for seq in ended:
            self.running.remove(seq)
            self.blocks.release(seq.table)
            seq.table = []
        self.busy_s += now - step.start
        self.steps += step.repeat
        self._measure(step)
        return firsts, ended

    # -- internals ----------------------------------------------------------------------------
    def _plan(self, now: float) -> Step:
        budget = self.shape.max_batch_tokens
        plan: list[tuple[SimSeq, int]] = []
        for seq in self.running:
            n = min(seq.prompt_len - seq.computed if seq.prefilling else 1, budget)
            if n <= 0:
                break
            plan.append((seq, n))
            budget -= n
        loaded, joined = 0, False
        while self.waiting and budget > 0 and len(self.running) < self.shape.max_seqs:
            seq = self.waiting[0]
            tokens = self._join(seq)
            if tokens is None:  # waits for blocks; running sequences will free some
                break
            self.waiting.popleft()
            self.running.append(seq)
            loaded, joined = loaded + tokens, True
            n = min(seq.prompt_len - seq.computed, budget)
            plan.append((seq, n))
            budget -= n
        if not plan:
            raise RuntimeError("KV cache too small for any waiting request")
        prefill = sum(n for seq, n in plan if seq.prefilling)
        decode = sum(1 for seq, _ in plan if not seq.prefilling)
        seconds = self.rates.step_seconds(prefill, decode, loaded)
        count = 1
        if not joined and decode == len(plan) == len(self.running):
            # only decodes, and nothing can change before the first of them ends
            count = min(seq.max_tokens - seq.produced for seq, _ in plan)
        return Step(plan, now, seconds, max(1, count), prefill, decode, loaded)

    def _measure(self, step: Step) -> None:
        """Feed the steps to :attr:`measured` as the real engine feeds its rates: step time
        without the loads, and the loads with their own time."""
        load_s = step.loaded / self.rates.load_tokens_per_s
        for i in range(step.repeat):
            self.measured.on_step(step.prefill, step.decode,
                                  step.seconds - (load_s if i == 0 else 0.0))
        if step.loaded:
            self.measured.on_load(step.loaded, load_s)

    def reported_rates(self) -> dict[str, float]:
        """The rates the router reads (a real worker's ``/info`` and ``/kv/events``): as
        measured, each falling back to the configured one until something measured it (the
        real bench warms every worker before it routes)."""
        configured = self.rates.reported()
        return {k: v if v is not None else configured[k]
                for k, v in self.measured.as_dict().items()}

    def _join(self, seq: SimSeq) -> int | None:
        """Give ``seq`` its blocks, reusing its prefix; tokens loaded from kvstore, or None
        (holding nothing) if the free blocks are too few."""
        bs = self.shape.block_size
        hashes = seq.hashes[:(seq.prompt_len - 1) // bs]  # keep >= 1 token to compute
        local = self.blocks.match_prefix(hashes)
        self.blocks.take(local)
        need = self.shape.blocks_for(seq.prompt_len + seq.max_tokens) - len(local)
        if need > self.blocks.num_free:
            self.blocks.release(local)
            return None
        stored = self.store.lookup(hashes[len(local):]) if self.store is not None else 0
        fresh = self.blocks.allocate(need)
        for i in range(stored):
            self.blocks.publish(fresh[i], hashes[len(local) + i])
        seq.table = local + fresh
        hit = len(local) + stored
        seq.computed, seq.published = hit * bs, hit
        seq.local_hit, seq.store_hit = len(local) * bs, stored * bs
        return stored * bs

    def _publish(self, seq: SimSeq) -> None:
        full = min(seq.computed // self.shape.block_size, len(seq.hashes))
        if full <= seq.published:
            return
        new = seq.hashes[seq.published:full]
        for i, h in enumerate(new, start=seq.published):
            self.blocks.publish(seq.table[i], h)
        seq.published = full
        if self.store is not None:
            self.store.save(new)
