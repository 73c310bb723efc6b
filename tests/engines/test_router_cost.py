"""The KV-aware cost arithmetic on its own: prefix overlap against queued work, kvstore hits
priced by the load rate, and measured rates against the fleet's median."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from engines.router.core import Router
from engines.router.cost import CostModel
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


def hold(r: Router, i: int, blocks: int) -> None:
    r.workers[i].resident = set(r.hasher.hash_blocks(PROMPT)[:blocks])  # type: ignore[union-attr]


def test_overlap_wins_until_the_queue_outweighs_it() -> None:
    r = make()
    a = r.workers[0]
    hold(r, 0, 8)
    assert ranked(r)[0] == "http://a"
    a.pending_prefill = 31  # 32 tokens saved by the overlap still beat 31 queued tokens
    assert ranked(r)[0] == "http://a"
    a.pending_prefill = 33
    assert ranked(r)[0] == "http://b"


def test_running_decodes_are_priced_at_the_decode_rate() -> None:
    r = make()
    a, b = r.workers
    hold(r, 0, 8)
    for w in (a, b):
        w.rates = {"prefill_tokens_per_s": 1000.0, "decode_tokens_per_s": 250.0}
    a.decoding = 7  # 7 decode tokens a step = 28 prefill tokens < the 32 saved
    assert ranked(r)[0] == "http://a"
    a.decoding = 9  # 36 > 32
    assert ranked(r)[0] == "http://b"


def test_kvstore_hits_are_credited_by_the_measured_load_rate() -> None:
    r = make(store=StoreHolding(10))
    a, b = r.workers
    hold(r, 0, 8)
    # loading is 4x faster than prefill: a store block saves 3/4 of its prefill
    for w in (a, b):
        w.rates = {"prefill_tokens_per_s": 1000.0, "load_tokens_per_s": 4000.0}
    # a: 1 token to compute, 8 to load (2 tokens' worth); b: 1 + 40 to load (10): a by 8
    a.pending_prefill = 7
    assert ranked(r)[0] == "http://a"
    a.pending_prefill = 9
    assert ranked(r)[0] == "http://b"


def test_store_weight_override_and_unmeasured_workers_borrow_the_fleet_median() -> None:
    r = make(store=StoreHolding(10), store_weight=1.0)  # loading a block is as good as holding it
    a, b = r.workers
    hold(r, 0, 8)
    b.pending_prefill = 1
    assert ranked(r)[0] == "http://a"  # equal work: the lighter queue wins
    a.pending_prefill = 2
    assert ranked(r)[0] == "http://b"
    model = CostModel()
    a.rates = {"prefill_tokens_per_s": 500.0}
    prices = model.prices([a, b])
    assert prices[b].prefill == prices[a].prefill == pytest.approx(1 / 500)
    assert prices[a].load == pytest.approx(1 / 1000)  # no load rate anywhere: half a prefill


def test_round_robin_ignores_overlap_and_rotates() -> None:
    r = make("round-robin")
    hold(r, 0, 10)
    firsts = [ranked(r)[0] for _ in range(4)]
    assert firsts == ["http://a", "http://b", "http://a", "http://b"]


def test_down_workers_are_skipped_until_their_retry_time() -> None:
    r = make()
    r._mark_down(r.workers[0], "test")
    assert ranked(r) == ["http://b"]
    r.workers[0].down_until = 0.0
    assert set(ranked(r)) == {"http://a", "http://b"}


def test_unknown_policy_and_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="least-loaded"):
        make("fastest")
    with pytest.raises(ValueError):
        make(store_weight=1.5)


def test_workers_are_priced_at_the_fleets_median_rates_not_their_own() -> None:
    """A worker that happened to measure a faster prefill does not take every request: the
    rates are the fleet's medians, so equal workers rotate."""
    r = Router(["http://a", "http://b", "http://c"], policy="kv")
    r.hasher, r.namespace = BlockHasher("sha256", None, BS), "ns"
    for w, rate in zip(r.workers, (3000.0, 1000.0, 900.0), strict=True):
        w.rates = {"prefill_tokens_per_s": rate}
    prices = CostModel().prices(r.workers)
    assert [p.prefill for p in prices.values()] == [pytest.approx(1 / 1000)] * 3
    assert {ranked(r)[0] for _ in range(6)} == {"http://a", "http://b", "http://c"}
