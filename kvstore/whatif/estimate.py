"""From a scope's sampled sums to hit rates: how the requests the sample did not see are
counted.

Each sampled request stands for ``1 / rate`` requests, so the sample's requests weigh ``W``
while the scope saw ``N``. They differ mostly because of a few blocks requested very often (a
tenant's system prompt, a popular document) that happen to be in or out of the sample: each
such block moves ``W`` by its whole request count. Three ways to count ``N - W``:

- ``none``: not at all; the hit rate is the sample's own, ``H / W``.
- ``shards``: as hits (SHARDS_adj, Waldspurger et al., FAST'15): ``(H + N - W) / N``. Right
  when the blocks that cause the deviation hit at every capacity of interest (the hottest keys
  of a Zipf trace), too high when they do not (a prefix reread only every few hundred MB).
- ``regression`` (the default): at the hit rate ``beta`` of the sampled blocks most like the
  ones that cause it, ``(H + beta * (N - W)) / N``. This is the survey-sampling regression
  estimator with the block's request count as the auxiliary variable: ``beta`` weighs each
  sampled request by the square of its block's request count so far, so the most requested
  blocks decide it, as they decide the deviation.

Measured by ``bench/bench_whatif.py`` (LRU, rate 1%, seven traces, five hash draws each): the
median error per trace is 0.006 to 0.047 with ``regression``, 0.005 to 0.045 with ``shards``
and 0.014 to 0.077 with ``none``; the worst draw 0.012 to 0.088, 0.012 to 0.114 and 0.023 to
0.339. SHARDS_adj is better on the eviction bench's chat trace (0.008 against 0.017), worse on
shared system prompts (0.029 against 0.013).
"""

from __future__ import annotations

from typing import NamedTuple

from kvstore.whatif.config import Adjust


class Sums(NamedTuple):
    """A scope's sums: ``requests`` seen (N), ``weight`` of the sampled ones (W) and their
    ``heavy`` weight (each ``weight * count**2``); at each capacity point, the weight and heavy
    weight of the sampled requests that hit."""

    requests: int
    weight: float
    heavy: float
    hits: list[float]
    heavy_hits: list[float]


def hit_rates(sums: Sums, adjust: Adjust) -> list[float]:
    """The scope's hit rate at each point, clipped to [0, 1] (0 where nothing was seen)."""
    n, w = sums.requests, sums.weight
    if adjust == "none" or not n:
        return [min(1.0, h / w) if w else 0.0 for h in sums.hits]
    out = []
    for h, hh in zip(sums.hits, sums.heavy_hits, strict=True):
        beta = 1.0 if adjust == "shards" else (hh / sums.heavy if sums.heavy else 0.0)
        out.append(min(1.0, max(0.0, (h + beta * (n - w)) / n)))
    return out
