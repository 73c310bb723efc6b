"""What the router counts of the requests it serves: requests, failures, retries, prompt
tokens and the prefix hits they got (on a worker, and from kvstore), in total and per worker,
and the ``GET /stats`` document built from them.

Per-worker numbers live on each :class:`~engines.router.workers.Worker`; :class:`Accounts`
owns the totals and moves both when a request is served.
"""

from __future__ import annotations

from typing import Any

from engines.router.workers import Worker


class Accounts:
    """The router's totals; owned by its asyncio loop."""

    def __init__(self) -> None:
        self.totals = {"requests": 0, "failed": 0, "retries": 0, "prompt_tokens": 0,
                       "hit_tokens": 0, "store_prefix_tokens": 0}

    def served(self, w: Worker, doc: dict[str, Any], prompt_tokens: int,
               store_tokens: int) -> None:
        """``w`` took a request of ``prompt_tokens`` (its first answer is ``doc``, which says
        how many it found cached); kvstore held ``store_tokens`` of the prompt."""
        hit = int(doc.get("cached_tokens", 0))
        w.up, w.routed = True, w.routed + 1
        w.prompt_tokens += prompt_tokens
        w.hit_tokens += hit
        t = self.totals
        t["requests"] += 1
        t["prompt_tokens"] += prompt_tokens
        t["hit_tokens"] += hit
        t["store_prefix_tokens"] += store_tokens

    def retried(self) -> None:
        """A worker failed a request that another one will be asked to serve."""
        self.totals["retries"] += 1

    def failed(self) -> None:
        """A request failed: every worker failed it, or a healthy worker failed it alone."""
        self.totals["failed"] += 1

    def stats(self, policy: str, workers: list[Worker]) -> dict[str, Any]:
        """The ``GET /stats`` document: the totals, the prefix hit rate and each worker."""
        t = self.totals
        return {
            "policy": policy, **t,
            "prefix_hit_rate": t["hit_tokens"] / t["prompt_tokens"] if t["prompt_tokens"] else 0,
            "workers": {w.url: {"role": w.role, "up": w.up, "inflight": w.inflight,
                                "queued_tokens": w.queued, "rates": w.rates,
                                "routed": w.routed, "failures": w.failures,
                                "prompt_tokens": w.prompt_tokens, "hit_tokens": w.hit_tokens,
                                "resident_blocks": len(w.resident)}
                        for w in workers},
        }
