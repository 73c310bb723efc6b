"""Continuous batching with chunked prefill, local prefix reuse and kvstore reuse.

Each step has a token budget (``max_batch_tokens``). Running sequences are served first (a
decode costs one token, an unfinished prefill its next chunk), then waiting sequences join the
batch while budget, sequence slots and free blocks last, so a new request starts prefilling in
the same step in which others decode. A sequence that cannot get a block preempts the newest
running sequence, which frees its blocks and later recomputes (its full blocks usually come
straight back from the local prefix cache or kvstore).

Prefix reuse happens once, when a sequence is first admitted: its full-block hashes are
matched against blocks resident in this engine, then the rest against kvstore, whose hits are
copied into fresh blocks instead of being computed. The last prompt token is always computed,
because its logits give the first output token. After each step, blocks that became full are
published to the local index and saved to kvstore in one batch.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from engines.decoder.paged_kv import BlockManager
from engines.decoder.rates import Rates
from engines.decoder.sampler import SamplingParams
from engines.store_io import KVConnector
from kvstore.keys import BlockHasher


@dataclass(slots=True, eq=False)
class Sequence:
    """One request. ``tokens`` is the prompt followed by the output so far; ``num_computed``
    tokens have their K/V in ``block_table``'s blocks."""

    req_id: str
    tokens: list[int]
    num_prompt: int
    params: SamplingParams
    generator: torch.Generator | None = None
    cache_salt: str | None = None  # hashed into the first block (isolates prefix reuse)
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    num_published: int = 0  # leading full blocks published locally and saved to kvstore
    local_hit_tokens: int = 0
    store_hit_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None  # why the engine failed this request (finish_reason "error")
    arrival: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None  # first joined the running batch (loads done)
    load_s: float = 0.0  # spent loading its prefix from kvstore (every admission attempt)
    first_token_at: float | None = None

    @property
    def output(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class TokenCounts:
    """What the scheduler counts: prompt tokens by where their KV came from (its own cache,
    kvstore, computed) and preemptions."""

    prompt_tokens: int = 0
    local_hit_tokens: int = 0
    store_hit_tokens: int = 0
    computed_tokens: int = 0
    preemptions: int = 0


class Scheduler:
    """Plans each step; owns the waiting queue, the running batch and block accounting."""

    def __init__(self, blocks: BlockManager, hasher: BlockHasher, *, max_batch_tokens: int,
                 max_seqs: int, eos_token_ids: tuple[int, ...] = (),
                 connector: KVConnector | None = None, rates: Rates | None = None) -> None:
        self.blocks, self.hasher, self.connector = blocks, hasher, connector
        self.rates = rates if rates is not None else Rates()
        self.block_size = hasher.block_size
        self.max_batch_tokens, self.max_seqs = max_batch_tokens, max_seqs
        self.eos = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = TokenCounts()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.stats.prompt_tokens += seq.num_prompt

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """Sequences to run this step and how many of their next tokens each computes."""
        budget = self.max_batch_tokens
        plan: list[tuple[Sequence, int]] = []
        for seq in list(self.running):
            if seq not in self.running:  # preempted below by an older sequence
                continue
            n = min(len(seq.tokens) - seq.num_computed, budget)
            if n <= 0:
                break
            while not self._reserve(seq, seq.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                plan.append((seq, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            seq = self.waiting[0]
            self._reuse_prefix(seq)  # waiting sequences hold no blocks
            n = min(len(seq.tokens) - seq.num_computed, budget)
            if not self._reserve(seq, seq.num_computed + n):
                # wait for blocks, holding none: its prefix blocks stay cached (published), so
                # the retry finds them locally, and running sequences can use the space
                self.blocks.release(seq.block_table)
                seq.block_table, seq.num_computed, seq.num_published = [], 0, 0
                break
            self.waiting.popleft()
            self.running.append(seq)
            if seq.admitted_at is None:
                seq.admitted_at = time.perf_counter()
            self.stats.local_hit_tokens += seq.local_hit_tokens
            self.stats.store_hit_tokens += seq.store_hit_tokens
            plan.append((seq, n))
            budget -= n
        return plan

    def update(self, plan: list[tuple[Sequence, int]], sampled: dict[Sequence, int]) -> None:
        """Account for a finished step: ``sampled`` maps each sequence that completed its
        pending tokens to its next token. Publishes and saves newly full blocks; retires
        finished sequences."""
        save_hashes: list[bytes] = []
        save_blocks: list[int] = []
        now = time.perf_counter()
        for seq, n in plan:
            seq.num_computed += n
            self.stats.computed_tokens += n
            self._publish(seq, save_hashes, save_blocks)
            token = sampled.get(seq)
            if token is None:
                continue
            seq.tokens.append(token)
            if seq.first_token_at is None:
                seq.first_token_at = now
            stop = token in seq.params.stop_token_ids
            if stop or (token in self.eos and not seq.params.ignore_eos):
                seq.finish_reason = "stop"
            elif len(seq.tokens) - seq.num_prompt >= seq.params.max_tokens:
                seq.finish_reason = "length"
        if self.connector is not None and save_hashes:
            self.connector.save(save_hashes, save_blocks)
        for seq, _ in plan:
            if seq.finished:
                self.running.remove(seq)
                self.blocks.release(seq.block_table)
                seq.block_table = []

    def fail(self, seq: Sequence, why: str) -> None:
        """Drop ``seq`` because the engine could not run it (``finish_reason`` "error",
        ``error`` says why); the other sequences go on."""
        seq.finish_reason, seq.error = "error", why
        self.abort(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop ``seq`` wherever it is and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.finish_reason = seq.finish_reason or "abort"

    def _hashes(self, seq: Sequence, n_blocks: int) -> list[bytes]:
        """``seq.block_hashes`` extended (chained, incrementally) to ``n_blocks`` blocks."""
        have = len(seq.block_hashes)
        if n_blocks > have:
            bs = self.block_size
            parent = seq.block_hashes[-1] if have else None
            tokens = seq.tokens[have * bs:n_blocks * bs]
            seq.block_hashes += (self.hasher.hash_blocks(tokens, parent=parent) if have else
                                 self.hasher.hash_blocks(tokens, cache_salt=seq.cache_salt))
        return seq.block_hashes

    def _reuse_prefix(self, seq: Sequence) -> None:
        limit = (len(seq.tokens) - 1) // self.block_size  # keep >= 1 token to compute
        hashes = self._hashes(seq, limit)[:limit]
        local = self.blocks.match_prefix(hashes)
        self.blocks.take(local)
        table = list(local)
        stored = 0
        if self.connector is not None and len(table) < limit:
            started = time.perf_counter()
            want = self.connector.lookup(hashes[len(table):])
            want = min(want, self.blocks.num_free)
            if want:
                fresh = self.blocks.allocate(want)
                stored = self.connector.load(hashes[len(table):len(table) + want], fresh)
                for i in range(stored):
                    self.blocks.publish(fresh[i], hashes[len(table) + i])
                self.blocks.release(fresh[stored:])
                table += fresh[:stored]
                self.rates.on_load(stored * self.block_size, time.perf_counter() - started)
            seq.load_s += time.perf_counter() - started
        bs = self.block_size
        seq.block_table = table
        seq.num_computed, seq.num_published = len(table) * bs, len(table)
        seq.local_hit_tokens, seq.store_hit_tokens = len(local) * bs, stored * bs

    def _reserve(self, seq: Sequence, upto_tokens: int) -> bool:
        need = -(-upto_tokens // self.block_size) - len(seq.block_table)
        if need <= 0:
            return True
        if need > self.blocks.num_free:
            return False
        seq.block_table += self.blocks.allocate(need)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.block_table)
        seq.block_table, seq.num_computed, seq.num_published = [], 0, 0
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1

    def _publish(self, seq: Sequence, hashes_out: list[bytes], blocks_out: list[int]) -> None:
        full = seq.num_computed // self.block_size
        if full <= seq.num_published:
            return
        hashes = self._hashes(seq, full)
        for i in range(seq.num_published, full):
            self.blocks.publish(seq.block_table[i], hashes[i])
            hashes_out.append(hashes[i])
            blocks_out.append(seq.block_table[i])
        seq.num_published = full
