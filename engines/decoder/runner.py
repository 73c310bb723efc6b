"""The engine: model + paged cache + scheduler + sampler, driven one ``step()`` at a time.

``step()`` is: plan, build the flat batch, run the model, sample, account. The engine is
single-threaded by design; the HTTP worker runs it in one thread and feeds it through a queue.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence as Seq
from pathlib import Path

import torch

from engines.decoder.config import EngineConfig, ModelConfig, parse_dtype
from engines.decoder.model import AttnBatch, LlamaForCausalLM
from engines.decoder.paged_kv import BlockManager, allocate_cache, block_bytes
from engines.decoder.rates import Rates
from engines.decoder.sampler import SamplingParams, make_generator, sample
from engines.decoder.scheduler import Scheduler, Sequence
from engines.messages import ConnectorCounts, EngineStats
from engines.store_io import BlockStore, KVConnector
from kvstore.keys import BlockHasher
from kvstore.namespace import Layout

_ids = itertools.count()
log = logging.getLogger(__name__)


def cache_layout(cfg: ModelConfig, ecfg: EngineConfig, dtype: torch.dtype) -> Layout:
    """The kvstore namespace layout of this engine's blocks (identity of the byte layout)."""
    return Layout(
        model_id=cfg.model_id, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, block_size=ecfg.block_size,
        dtype=str(dtype).removeprefix("torch."),
        layout_name="engines.decoder:block,layer,kv,token,head,dim",
    )


class Engine:
    """A continuous-batching decoder over one checkpoint folder.

    ``store`` (optional) enables prefix reuse through kvstore: hits are loaded instead of
    computed and new full blocks are saved. Not thread-safe."""

    def __init__(self, model_dir: str | Path, ecfg: EngineConfig | None = None,
                 store: BlockStore | None = None) -> None:
        self.ecfg = ecfg = ecfg or EngineConfig()
        cfg = ModelConfig.from_dir(model_dir)
        dtype = parse_dtype(ecfg.dtype or cfg.dtype)
        if ecfg.device == "cpu" and dtype == torch.float16:
            dtype = torch.float32  # CPU half matmuls are slow and inexact
        self.model_cfg, self.dtype, self.device = cfg, dtype, torch.device(ecfg.device)
        self.model = LlamaForCausalLM.from_pretrained(model_dir, device=ecfg.device, dtype=dtype)
        self.cache = allocate_cache(cfg, ecfg, dtype)
        self.blocks = BlockManager(ecfg.num_blocks)
        self.hasher = BlockHasher(ecfg.hash_algo, ecfg.hash_seed, ecfg.block_size)
        self.layout = cache_layout(cfg, ecfg, dtype)
        self.namespace = ecfg.namespace or _namespace_name(self.layout, block_bytes(self.cache))
        self.connector = None
        if store is not None:
            self.connector = KVConnector(store, self.cache, self.namespace, self.layout,
                                         ecfg.hash_algo, ecfg.hash_seed)
        self.rates = Rates()
        self.scheduler = Scheduler(
            self.blocks, self.hasher, max_batch_tokens=ecfg.max_batch_tokens,
            max_seqs=ecfg.max_seqs, eos_token_ids=cfg.eos_token_ids, connector=self.connector,
            rates=self.rates,
        )
        self.steps = 0
        self.last_logits: torch.Tensor | None = None

    @property
    def block_bytes(self) -> int:
        return block_bytes(self.cache)

    def add_request(self, prompt_ids: Seq[int], params: SamplingParams | None = None,
                    req_id: str | None = None, cache_salt: str | None = None) -> Sequence:
        """Queue a request; it joins the running batch at the next ``step()``. A
        ``cache_salt`` enters its first block's hash (as vLLM's): it reuses, locally and from
        kvstore, only prefixes cached under the same salt."""
        params = params or SamplingParams()
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        vocab = self.model_cfg.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        need, cfg = len(prompt_ids) + params.max_tokens, self.ecfg
        if need > cfg.num_blocks * cfg.block_size:
            raise ValueError(
                f"prompt plus max_tokens exceeds the KV cache: {len(prompt_ids)} prompt tokens "
                f"+ max_tokens {params.max_tokens} = {need} tokens, and the cache holds "
                f"{cfg.num_blocks * cfg.block_size} ({cfg.num_blocks} blocks of "
                f"{cfg.block_size} tokens); shorten the prompt, lower max_tokens or raise "
                "num_blocks (--num-blocks)")
        seq = Sequence(req_id or f"req-{next(_ids)}", [int(t) for t in prompt_ids],
                       len(prompt_ids), params, make_generator(params), cache_salt=cache_salt)
        self.scheduler.add(seq)
        return seq

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Sequence]:
        """Run one forward step; returns the sequences that got a new token and those it
        failed (``finish_reason`` "error", ``error`` says why). A failure that belongs to
        one request (its sampling raised, or the forward pass raised and, run alone, raises
        again for it) fails only that request; the others of the step go on."""
        plan = self.scheduler.schedule()
        if not plan:
            sched = self.scheduler
            if sched.waiting and not sched.running:
                # nothing runs, so every block is free or evictable: the head never fits
                seq = sched.waiting[0]
                sched.fail(seq, "the prompt does not fit the free KV cache")
                return [seq]
            if sched.has_work():
                raise RuntimeError("KV cache too small for any waiting request")
            return []
        started = time.perf_counter()
        try:
            sampling, sampled, failed = self._run(plan)
        except Exception:
            log.warning("an engine step of %d requests failed; running them one by one",
                        len(plan), exc_info=True)
            sampling, sampled, failed = self._run_alone(plan)
        plan = [(seq, n) for seq, n in plan if seq.error is None]
        # loads (in schedule) and saves (in update) are timed apart: the router prices them
        prefill = sum(n for seq, n in plan if seq.num_computed < seq.num_prompt)
        computed = sum(n for _, n in plan)
        self.rates.on_step(prefill, computed - prefill, time.perf_counter() - started)
        self.scheduler.update(plan, sampled)
        self.steps += 1
        return [seq for seq in sampling if seq.error is None] + failed

    def _run(self, plan: list[tuple[Sequence, int]]) -> tuple[
            list[Sequence], dict[Sequence, int], list[Sequence]]:
        """Forward ``plan`` and sample: the sequences that complete their pending tokens,
        their next tokens, and the ones whose sampling failed (already failed in the
        scheduler). Raises what the forward pass raises."""
        tokens, batch, sampling = self._build(plan)
        rows = self.model(tokens, batch, self.cache).cpu()
        self.last_logits = rows  # [len(sampling), vocab]; tests compare it to transformers
        sampled: dict[Sequence, int] = {}
        failed: list[Sequence] = []
        for i, seq in enumerate(sampling):
            try:
                sampled[seq] = sample(rows[i], seq.params, seq.generator)
            except Exception as exc:  # this request's logits or parameters: only it fails
                self.scheduler.fail(seq, f"sampling failed: {exc}")
                failed.append(seq)
        return sampling, sampled, failed

    def _run_alone(self, plan: list[tuple[Sequence, int]]) -> tuple[
            list[Sequence], dict[Sequence, int], list[Sequence]]:
        """The failed step again, one sequence at a time, to find the ones it belongs to.
        Safe to repeat: nothing was accounted, and a rerun writes the same K/V into the same
        slots of the sequence's own blocks."""
        sampling: list[Sequence] = []
        sampled: dict[Sequence, int] = {}
        failed: list[Sequence] = []
        for item in plan:
            try:
                got, tokens, bad = self._run([item])
            except Exception as exc:
                self.scheduler.fail(item[0], f"the engine step failed: {exc!r}")
                failed.append(item[0])
                continue
            sampling += got
            sampled.update(tokens)
            failed += bad
        return sampling, sampled, failed

    def generate(self, prompts: Seq[Seq[int]], params: SamplingParams | None = None) -> list[
            list[int]]:
        """Run ``prompts`` together to completion; output token ids per prompt."""
        seqs = [self.add_request(p, params) for p in prompts]
        while self.has_work():
            self.step()
        return [s.output for s in seqs]

    def forward_logits(self, plan: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Logits of the planned step without sampling (tests compare them to transformers)."""
        tokens, batch, _ = self._build(plan)
        return self.model(tokens, batch, self.cache)

    def reset_prefix_cache(self) -> None:
        """Forget every resident block (as after a restart; kvstore keeps its copies). Only
        while idle; raises ``RuntimeError`` otherwise."""
        if self.has_work():
            raise RuntimeError("reset_prefix_cache needs an idle engine")
        self.blocks = BlockManager(self.ecfg.num_blocks)
        self.scheduler.blocks = self.blocks

    def stats(self) -> EngineStats:
        connector = self.connector
        return EngineStats(
            **dataclasses.asdict(self.scheduler.stats), steps=self.steps,
            free_blocks=self.blocks.num_free,
            running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
            rates=self.rates.as_dict(),
            kvstore=None if connector is None
            else ConnectorCounts(**dataclasses.asdict(connector.stats)))

    def _build(self, plan: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, AttnBatch,
                                                                  list[Sequence]]:
        bs = self.ecfg.block_size
        toks: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        seq_index: list[int] = []
        q_index: list[int] = []
        logits_index: list[int] = []
        sampling: list[Sequence] = []
        max_q = max(n for _, n in plan)
        query_pos = torch.zeros(len(plan), max_q, dtype=torch.long)
        width = max(-(-(s.num_computed + n) // bs) for s, n in plan)
        tables = torch.zeros(len(plan), width, dtype=torch.long)
        for i, (seq, n) in enumerate(plan):
            start = seq.num_computed
            toks += seq.tokens[start:start + n]
            positions = range(start, start + n)
            pos += positions
            table = seq.block_table
            slots += [table[p // bs] * bs + p % bs for p in positions]
            seq_index += [i] * n
            q_index += range(n)
            query_pos[i, :n] = torch.arange(start, start + n)
            used = -(-(start + n) // bs)
            tables[i, :used] = torch.tensor(table[:used])
            if start + n == len(seq.tokens):
                logits_index.append(len(toks) - 1)
                sampling.append(seq)
        dev = self.device

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.long, device=dev)

        batch = AttnBatch(t(pos), t(slots), t(seq_index), t(q_index), tables.to(dev),
                          query_pos.to(dev), t(logits_index))
        return t(toks), batch, sampling


def _namespace_name(layout: Layout, nbytes: int) -> str:
    import hashlib
    import json

    doc = layout.to_dict()
    if not doc["extra"]:  # named as before the layout was typed: the same blocks, found again
        del doc["extra"]
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]
    model = "".join(c if c.isalnum() or c in "._-" else "-" for c in layout.model_id)[:64]
    return f"engine.{model or 'model'}.{nbytes}.{digest}"
