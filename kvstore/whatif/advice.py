"""The capacity advisor: what more capacity in a tier would save, priced in the prefill its
misses cause.

A block a tier misses is, at worst, a block the engine computes again: ``block_size`` tokens of
prefill. Each namespace's curve says how many more of its requests the tier would serve at a
larger capacity; at today's rate of requests (its requests over the window the curves cover)
and the namespace's tokens per block that is a number of prefill tokens an hour, and at the
engine's prefill rate (tokens a second, measured by the built-in engine or given for vLLM) a
number of prefill seconds an hour. It is an upper bound on what an engine gains: a block a
lower tier would have served instead still costs a read, and only the first miss of a chain
makes the engine compute the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.whatif.result import Curve, Point

NEXT_STEP = 2.0  # the next step of capacity the advisor prices first: twice today's


@dataclass(frozen=True, slots=True)
class Share:
    """One namespace's part of a scope: its own curve (in the shared tier) and its tokens per
    block (0: unknown, its blocks are counted but not priced)."""

    namespace: str
    curve: Curve
    block_tokens: int


@dataclass(frozen=True, slots=True)
class Step:
    """A capacity above today's and what it would add at today's traffic: ``hits_per_hour``
    more blocks served, ``tokens_per_hour`` fewer prefill tokens (namespaces whose tokens per
    block are known), ``prefill_s_per_hour`` fewer prefill seconds (None without a rate)."""

    capacity_bytes: int
    hit_rate: float
    hits_per_hour: float
    tokens_per_hour: float
    prefill_s_per_hour: float | None


@dataclass(frozen=True, slots=True)
class Advice:
    """For one tier and scope: its ``curve``, the seconds of traffic it covers, the next step
    (:data:`NEXT_STEP` times today's capacity) and every point of the curve above today's
    capacity. ``unpriced``: namespaces whose layout names no ``block_size``."""

    curve: Curve
    window_s: float
    prefill_tokens_per_s: float | None
    next_step: Step
    steps: tuple[Step, ...]
    unpriced: tuple[str, ...]

    @property
    def tier(self) -> str:
        return self.curve.tier

    @property
    def current(self) -> Point:
        return self.curve.current

    @property
    def requests_per_hour(self) -> float:
        return self.curve.accesses * 3600.0 / max(self.window_s, 1e-9)


def advise(whole: Curve, shares: Sequence[Share], window_s: float,
           prefill_tokens_per_s: float | None) -> Advice:
    """The advice for the scope whose curve is ``whole`` and whose namespaces are ``shares``,
    over ``window_s`` seconds of traffic."""
    if prefill_tokens_per_s is not None and prefill_tokens_per_s <= 0:
        raise ValueError(f"prefill_tokens_per_s must be positive, got {prefill_tokens_per_s}")
    hours = max(window_s, 1e-9) / 3600.0
    today = whole.current.capacity_bytes

    def step(capacity: int) -> Step:
        hits = tokens = 0.0
        for share in shares:
            c = share.curve
            more = (c.at(capacity) - c.at(today)) * c.accesses / hours
            hits += more
            tokens += more * share.block_tokens
        return Step(capacity, whole.at(capacity), hits, tokens,
                    None if prefill_tokens_per_s is None else tokens / prefill_tokens_per_s)

    return Advice(
        whole, window_s, prefill_tokens_per_s, step(round(today * NEXT_STEP)),
        tuple(step(p.capacity_bytes) for p in whole.points if p.capacity_bytes > today),
        tuple(s.namespace for s in shares if s.block_tokens <= 0))
