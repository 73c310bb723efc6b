"""Block traces for ``bench_whatif.py``: the requests of ``engines/workload.py`` turned into the
chained block hashes the store sees (``BlockHasher``, SHA-256, 16-token blocks, one access per
full prompt block, request by request in arrival order), and the eviction bench's traces with
each block id turned into a SHA-256 hash.

A trace is a list of spans (one request, or 32 accesses of an id trace): a namespace, a block
size and a run of hashes, which is how the store would feed a tracker (one namespace per
call). Block sizes are a model's KV per 16-token block in bf16: 2 MiB for an 8B Llama (32
layers, 8 KV heads of 128), 5 MiB for a 70B one (80 layers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from bench_eviction import chat_trace, scan_trace, zipf_trace

from engines.workload import WorkloadConfig, generate
from kvstore.keys import BlockHasher

MIB = 1 << 20
SMALL, LARGE = 2 * MIB, 5 * MIB  # bytes per block: 8B and 70B Llama, 16 tokens, bf16
CURRENT_SHARE = 0.05  # today's capacity: this share of the trace's distinct bytes


@dataclass(frozen=True)
class Span:
    namespace: str
    size: int  # bytes per block
    start: int  # [start, end) in Trace.hashes
    end: int


@dataclass(frozen=True)
class Trace:
    name: str
    hashes: list[bytes]
    spans: list[Span]

    def keys_and_sizes(self) -> tuple[list[tuple[str, bytes]], list[int]]:
        """Every access as a store key and its size, for the exact replay."""
        keys: list[tuple[str, bytes]] = []
        sizes: list[int] = []
        for s in self.spans:
            keys += [(s.namespace, h) for h in self.hashes[s.start:s.end]]
            sizes += [s.size] * (s.end - s.start)
        return keys, sizes

    def distinct_bytes(self) -> int:
        keys, sizes = self.keys_and_sizes()
        return sum(dict(zip(keys, sizes, strict=True)).values())

    def current(self) -> int:
        """Today's capacity for the bench: ``CURRENT_SHARE`` of the distinct bytes."""
        return round(CURRENT_SHARE * self.distinct_bytes())

    def resalted(self, salt: int) -> Trace:
        """The same trace with every hash replaced by another uniform one: the same reuse,
        another draw of the sampled blocks (salt 0: the trace itself)."""
        if not salt:
            return self
        prefix = salt.to_bytes(4, "big")
        table = {h: hashlib.sha256(prefix + h).digest() for h in set(self.hashes)}
        return Trace(self.name, [table[h] for h in self.hashes], self.spans)


def _from_workload(name: str, cfg: WorkloadConfig,
                   namespace_of: Callable[[int, int], tuple[str, int]]) -> Trace:
    hasher = BlockHasher("sha256", None, 16)
    hashes: list[bytes] = []
    spans: list[Span] = []
    for r in generate(cfg):
        blocks = hasher.hash_blocks(r.prompt)
        ns, size = namespace_of(r.tenant, r.index)
        spans.append(Span(ns, size, len(hashes), len(hashes) + len(blocks)))
        hashes += blocks
    return Trace(name, hashes, spans)


def _one_model(_: int, __: int) -> tuple[str, int]:
    return "llama-8b", SMALL


def _two_models(tenant: int, index: int) -> tuple[str, int]:
    """Even tenants run the 8B model, odd ones the 70B (one-off prompts alternate)."""
    odd = (tenant if tenant >= 0 else index) % 2
    return ("llama-70b", LARGE) if odd else ("llama-8b", SMALL)


def _from_ids(name: str, ids: list[int]) -> Trace:
    table = {i: hashlib.sha256(i.to_bytes(8, "big")).digest() for i in set(ids)}
    hashes = [table[i] for i in ids]
    spans = [Span("bench", SMALL, i, min(i + 32, len(ids))) for i in range(0, len(ids), 32)]
    return Trace(name, hashes, spans)


def workload_traces(scale: float) -> dict[str, Callable[[], Trace]]:
    """Chat, RAG, shared system prompts and a two-model mix; ``scale`` 1 gives about a
    million block accesses each."""
    def sessions(n: int) -> int:
        return max(20, round(n * scale))

    return {
        "chat": lambda: _from_workload("chat", WorkloadConfig(
            sessions=sessions(1500), chat_share=1.0, rag_share=0.0, tenants=8), _one_model),
        "rag": lambda: _from_workload("rag", WorkloadConfig(
            sessions=sessions(2200), chat_share=0.0, rag_share=1.0, docs=1024), _one_model),
        # every prompt: one of 32 tenants' system prompts, then a question of its own
        "sysprompt": lambda: _from_workload("sysprompt", WorkloadConfig(
            sessions=sessions(9000), chat_share=0.0, rag_share=1.0, tenants=32, docs=1,
            doc_len=1, zipf_s=0.0), _one_model),
        "two-models": lambda: _from_workload("two-models", WorkloadConfig(
            sessions=sessions(2000), tenants=16, docs=256), _two_models),
    }


def eviction_traces(length: int) -> dict[str, Callable[[], Trace]]:
    """``bench_eviction.py``'s chat, zipf and scan traces, ``length`` accesses each."""
    def make(name: str, fn: Callable[[np.random.Generator, int], list[int]]) -> Callable[[],
                                                                                        Trace]:
        return lambda: _from_ids(f"ev-{name}", fn(np.random.default_rng(0), length))

    return {f"ev-{n}": make(n, fn) for n, fn in
            (("chat", chat_trace), ("zipf", zipf_trace), ("scan", scan_trace))}
