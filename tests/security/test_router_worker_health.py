"""The router counts a worker down only when it cannot be reached or its ``/health`` says it
is unhealthy, never because one request failed there: a 5xx from a healthy worker fails that
request alone (502 to the client, not tried on every other worker in turn), and the workers
stay up. Workers here are small HTTP servers on loopback that fail on purpose (a real worker no
longer fails a request it can validate); the router is a real ``kvstore-router`` process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from engines.testing import Proc, ThreadServer, router_proc


class FailingWorker:
    """A worker's routes; ``/generate`` answers 500 (the engine failed that request), and
    ``/health`` 200 or, with ``healthy`` False, 503."""

    def __init__(self, healthy: bool = True, serves: bool = False) -> None:
        self.healthy, self.serves, self.generates = healthy, serves, 0
        app = FastAPI()

        @app.get("/info")
        async def info() -> dict[str, Any]:
            return {"role": "both", "model_id": "stub", "block_size": 4, "hash_algo": "sha256",
                    "hash_seed": None, "namespace": "stub", "block_bytes": 64,
                    "num_blocks": 64, "kvstore": False, "device": "cpu", "rates": {},
                    "max_model_len": 256}

        @app.get("/health")
        async def health() -> JSONResponse:
            return JSONResponse({"ok": self.healthy}, status_code=200 if self.healthy else 503)

        @app.get("/kv/events")
        async def events() -> dict[str, Any]:
            return {"cursor": 0, "resync": False, "resident": [], "rates": {}, "events": []}

        @app.post("/generate")
        async def generate() -> JSONResponse:
            self.generates += 1
            if self.serves:
                return JSONResponse({"token_ids": [9], "finish_reason": "length",
                                     "prompt_tokens": 1, "cached_tokens": 0})
            return JSONResponse({"detail": "the engine failed this request"}, status_code=500)

        self.server = ThreadServer(app)


@pytest.fixture
def stubs() -> Iterator[list[FailingWorker]]:
    made: list[FailingWorker] = []
    yield made
    for s in made:
        s.server.stop()


def _start(stubs: list[FailingWorker], *workers: FailingWorker) -> Proc:
    stubs.extend(workers)
    for w in workers:
        w.server.start()
    return router_proc([w.server.url for w in workers], policy="round-robin").start()


def _workers_up(router: Proc) -> dict[str, bool]:
    return {url: w["up"] for url, w in
            httpx.get(f"{router.url}/stats", timeout=30).json()["workers"].items()}


def test_a_worker_is_down_only_when_its_health_says_so(stubs: list[FailingWorker]) -> None:
    a, b = FailingWorker(), FailingWorker()
    router = _start(stubs, a, b)
    try:
        for _ in range(4):
            r = httpx.post(f"{router.url}/v1/completions", timeout=60,
                           json={"prompt": [5, 6], "max_tokens": 1})
            assert r.status_code == 502, r.text
            assert "failed this request" in r.json()["error"]["message"]
        assert a.generates + b.generates == 4  # each request tried once, on one worker
        assert _workers_up(router) == {a.server.url: True, b.server.url: True}
        health = httpx.get(f"{router.url}/health", timeout=30).json()
        assert health["ready"] and health["workers_up"] == 2
        # an unhealthy worker is another matter: marked down, the request tried elsewhere
        a.healthy, b.serves = False, True
        for _ in range(2):  # round-robin: one of the two goes to the sick worker first
            r = httpx.post(f"{router.url}/v1/completions", timeout=60,
                           json={"prompt": [5, 6], "max_tokens": 1})
            assert r.status_code == 200, r.text
        assert a.generates + b.generates == 4 + 3
        assert _workers_up(router) == {a.server.url: False, b.server.url: True}
    finally:
        router.stop()
