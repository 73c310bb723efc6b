"""Traffic that shifts from prefill-heavy to decode-heavy: what the SLO planner is for.

The first half of :func:`two_phase_trace` is long prompts with short outputs (phase ``A``:
summaries, classification, RAG answers), the second short prompts with long outputs (``B``:
chat, generation); both Poisson. No fixed split of a fleet into prefill and decode workers
suits both halves, so a planner that moves workers between the pools as the traffic shifts
should serve more of it within its targets. Used by ``bench/bench_planner.py`` (a real fleet)
and :mod:`engines.simulator.pools` (a simulated one).
"""

from __future__ import annotations

import random
from typing import NamedTuple


class Arrival(NamedTuple):
    """One request of the trace: when it leaves, its lengths and its phase."""

    t: float  # seconds from the start
    prompt_len: int
    max_tokens: int
    phase: str


def two_phase_trace(seed: int, duration_s: float, rate_a: float, rate_b: float,
                    long_prompt: int = 384, short_out: int = 4, short_prompt: int = 16,
                    long_out: int = 48) -> list[Arrival]:
    """Poisson arrivals: the first half long prompts with short outputs (phase ``A``), the
    second half short prompts with long outputs (``B``); lengths vary +-25%."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_a if t < duration_s / 2 else rate_b)
        if t >= duration_s:
            return out
        p, n = (long_prompt, short_out) if t < duration_s / 2 else (short_prompt, long_out)
        out.append(Arrival(t, max(1, int(p * rng.uniform(0.75, 1.25))),
                           max(1, int(n * rng.uniform(0.75, 1.25))),
                           "A" if t < duration_s / 2 else "B"))


