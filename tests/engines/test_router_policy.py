"""The routing policies against real workers on loopback: session affinity keeps a session on
its worker, least-loaded avoids the busy worker, KV-aware follows the prefix (also before the
worker's residency events say it holds it) and prices with the rates the workers measured."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.messages import GenerateRequest
from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.store_io import LocalStore
from engines.testing import ThreadServer
from engines.worker import create_app as worker_app
from kvstore.config import StoreConfig, TierConfig
from kvstore.store import Store

ECFG = EngineConfig(block_size=4, num_blocks=128, max_batch_tokens=64)


def rand(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 97) for _ in range(n)]


@pytest.fixture
def three(gqa_model: Path) -> Iterator[list[ThreadServer]]:
    live = [ThreadServer(worker_app(Engine(gqa_model, ECFG))).start() for _ in range(3)]
    yield live
    for s in live:
        s.stop()


def complete(c: TestClient, prompt: list[int], **kw: object) -> str:
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0,
                                        "ignore_eos": True, **kw})
    assert r.status_code == 200, r.text
    return str(r.json()["kvstore"][0]["worker"])


def test_session_affinity_hashes_the_user_and_moves_only_a_lost_workers_sessions(
        three: list[ThreadServer]) -> None:
    urls = [w.url for w in three]
    with TestClient(router_app(Router(urls, policy="session"))) as c:
        # The ring hangs on the workers' URLs, whose ports are random: with 48 sessions the
        # chance that one worker gets none is about 3 * (2/3)**48, 1e-8 (12 left it at 2%).
        homes = {f"user{i}": complete(c, rand(9, i), user=f"user{i}") for i in range(48)}
        assert len(set(homes.values())) == 3  # the sessions spread over the 3 workers
        for i, (user, home) in enumerate(homes.items()):  # new prompts, same homes
            assert complete(c, rand(13, 100 + i), user=user) == home
        lost = homes["user0"]
        three[urls.index(lost)].stop()
        moved = {u: complete(c, rand(9, 200 + i), user=u) for i, u in enumerate(homes)}
        assert all(moved[u] == h for u, h in homes.items() if h != lost)
        assert all(moved[u] != lost for u in homes)


def test_least_loaded_sends_work_away_from_a_busy_worker(three: list[ThreadServer]) -> None:
    async def scenario() -> None:
        router = Router([w.url for w in three[:2]], policy="least-loaded")
        await router.start(poll=False)
        long = router.stream(GenerateRequest(prompt_ids=rand(40, 1), max_tokens=400,
                                             ignore_eos=True))
        busy = (await long.__anext__()).worker
        for i in range(3):  # the busy worker has 440 queued tokens; these are small
            short = await router.generate(GenerateRequest(prompt_ids=rand(8, 10 + i),
                                                          max_tokens=2, ignore_eos=True))
            assert short.worker != busy
        await long.aclose()
        assert all(w.queued == 0 and w.inflight == 0 for w in router.workers)
        await router.close()

    asyncio.run(scenario())


def test_kv_aware_follows_a_prefix_before_its_residency_events_arrive(
        three: list[ThreadServer]) -> None:
    async def scenario() -> None:
        router = Router([w.url for w in three], policy="kv")
        await router.start(poll=False)  # no background polls: residency only after requests
        shared = rand(200, 5)
        first = router.stream(GenerateRequest(prompt_ids=shared + [7], max_tokens=50,
                                              ignore_eos=True))
        await first.__anext__()  # the prefix is computed, the request still runs
        home = next(w for w in router.workers if w.inflight)
        assert not home.resident  # no event pulled yet: the blocks are promised
        assert home.local_prefix(list(router.hasher.hash_blocks(shared))) == 50  # type: ignore[union-attr]
        for tail in ([8, 9], [10, 11, 12]):
            done = await router.generate(GenerateRequest(prompt_ids=shared + tail,
                                                         max_tokens=2, ignore_eos=True))
            assert done.worker == home.url and done.message.cached_tokens == 200
        await first.aclose()
        assert not home.promised and home.inflight == home.pending_prefill == 0
        await router.close()

    asyncio.run(scenario())


def test_workers_measure_rates_and_the_router_reads_them(gqa_model: Path) -> None:
    probe = Engine(gqa_model, ECFG)
    slot = probe.block_bytes
    store = Store(StoreConfig((TierConfig("host", 256 * slot, options={"slot_bytes": slot}),)))
    live = [ThreadServer(worker_app(Engine(gqa_model, ECFG, LocalStore(store)))).start()
            for _ in range(2)]
    try:
        a, b = (w.url for w in live)
        prompt = rand(64, 9)
        httpx.post(f"{a}/generate", json={"prompt_ids": prompt, "max_tokens": 4,
                                          "ignore_eos": True}).raise_for_status()
        info = httpx.get(f"{a}/info").json()["rates"]
        assert info["prefill_tokens_per_s"] > 0 and info["decode_tokens_per_s"] > 0
        assert info["load_tokens_per_s"] is None  # nothing came from kvstore yet
        doc = httpx.post(f"{b}/generate", json={"prompt_ids": prompt, "max_tokens": 2,
                                                "ignore_eos": True}).json()
        assert doc["store_hit_tokens"] == 60  # every full block but the last token's

        async def scenario() -> None:
            router = Router([a, b], policy="kv", kvstore=LocalStore(store))
            await router.start(poll=False)
            wa, wb = router.workers
            await router.sync(wb)
            assert wb.rates["load_tokens_per_s"] > 0
            assert wa.rates["prefill_tokens_per_s"] > 0
            # the prompt is local on both now; a longer one is local nowhere but in kvstore
            hashes = list(router.hasher.hash_blocks(prompt + rand(16, 3)))  # type: ignore[union-attr]
            plan = await router.rank(router.workers, hashes, 80, 4)
            assert plan.store_blocks == 16
            await router.close()

        asyncio.run(scenario())
    finally:
        for s in live:
            s.stop()
        store.close()
