"""The routing arithmetic on its own: prefix overlap against queued work, kvstore hits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from engines.router.core import Router
from kvstore.keys import BlockHasher

BS = 4
PROMPT = list(range(1, 41))  # 10 full blocks


class StoreHolding:
    """Answers lookups as a store holding the first ``n`` blocks of any chain."""

    def __init__(self, n: int) -> None:
        self.n = n

    def lookup(self, namespace: str, hashes: Sequence[bytes]) -> int:
        return min(self.n, len(hashes))


def ranked(router: Router, max_tokens: int = 8) -> list[str]:
    hasher = router.hasher
    assert hasher is not None
    hashes = list(hasher.hash_blocks(PROMPT))
    plan = asyncio.run(router.rank(router.workers, hashes, len(PROMPT), max_tokens))
    return [w.url for w in plan.order]


def make(policy: str = "kv", store: StoreHolding | None = None, **kw: float) -> Router:
    r = Router(["http://a", "http://b"], policy=policy, kvstore=store, **kw)  # type: ignore[arg-type]
    r.hasher, r.namespace = BlockHasher("sha256", None, BS), "ns"
    return r


def test_overlap_wins_until_the_queue_outweighs_it() -> None:
    r = make()
    a = r.workers[0]
    a.resident = set(r.hasher.hash_blocks(PROMPT)[:8])  # type: ignore[union-attr]
    assert ranked(r)[0] == "http://a"
    a.queued = 31  # 32 tokens saved by the overlap still beat 31 queued tokens
    assert ranked(r)[0] == "http://a"
    a.queued = 33
    assert ranked(r)[0] == "http://b"


def test_kvstore_hits_narrow_the_local_advantage() -> None:
    r = make(store=StoreHolding(10), store_weight=1.0)  # loading a block is as good as holding it
    a, b = r.workers
    a.resident = set(r.hasher.hash_blocks(PROMPT)[:8])  # type: ignore[union-attr]
    b.queued = 1
    assert ranked(r)[0] == "http://a"  # equal work: the lighter queue wins
    a.queued = 2
    assert ranked(r)[0] == "http://b"
    half = make(store=StoreHolding(10), store_weight=0.5)
    half.workers[0].resident = set(half.hasher.hash_blocks(PROMPT)[:8])  # type: ignore[union-attr]
    half.workers[0].queued = 2
    assert ranked(half)[0] == "http://a"  # local blocks save 16 tokens more than loading them


def test_round_robin_ignores_overlap_and_rotates() -> None:
    r = make("round-robin")
    r.workers[0].resident = set(r.hasher.hash_blocks(PROMPT))  # type: ignore[union-attr]
    firsts = [ranked(r)[0] for _ in range(4)]
    assert firsts == ["http://a", "http://b", "http://a", "http://b"]


def test_down_workers_are_skipped_until_their_retry_time() -> None:
    r = make()
    r._mark_down(r.workers[0], "test")
    assert ranked(r) == ["http://b"]
    r.workers[0].down_until = 0.0
    assert set(ranked(r)) == {"http://a", "http://b"}
