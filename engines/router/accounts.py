"""What the router counts of the requests it serves: requests, failures, retries, prompt
tokens and the prefix hits they got (on a worker, and from kvstore), in total and per worker,
and the ``GET /stats`` document built from them.

Per-worker numbers live on each :class:`~engines.router.workers.Worker`; :class:`Accounts`
owns the totals and moves both when a request is served.
"""

from __future__ import annotations

from engines.messages import RoutedWorker, RouterStats
from engines.router.workers import Worker


class Accounts:
    """The router's totals; owned by its asyncio loop."""

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0  # requests no worker served
        self.retries = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.store_prefix_tokens = 0

    def served(self, w: Worker, hit: int, prompt_tokens: int, store_tokens: int) -> None:
        """``w`` took a request of ``prompt_tokens`` and found ``hit`` of them cached (its
        first answer said so); kvstore held ``store_tokens`` of the prompt."""
        w.up, w.routed = True, w.routed + 1
        w.prompt_tokens += prompt_tokens
        w.hit_tokens += hit
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += hit
        self.store_prefix_tokens += store_tokens

    def retried(self) -> None:
        """A worker failed a request that another one will be asked to serve."""
        self.retries += 1

    def failed(self) -> None:
        """A request failed: every worker failed it, or a healthy worker failed it alone."""
        self.failures += 1

    def stats(self, policy: str, workers: list[Worker]) -> RouterStats:
        """The ``GET /stats`` document: the totals, the prefix hit rate and each worker."""
        return RouterStats(
            policy=policy, requests=self.requests, failed=self.failures, retries=self.retries,
            prompt_tokens=self.prompt_tokens, hit_tokens=self.hit_tokens,
            store_prefix_tokens=self.store_prefix_tokens,
            prefix_hit_rate=self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0,
            workers={w.url: RoutedWorker(
                role=w.role, up=w.up, inflight=w.inflight, queued_tokens=w.queued,
                rates=dict(w.rates), routed=w.routed, failures=w.failures,
                prompt_tokens=w.prompt_tokens, hit_tokens=w.hit_tokens,
                resident_blocks=len(w.resident)) for w in workers},
        )
