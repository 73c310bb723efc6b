"""The worker's messages are one contract for both sides (``engines/messages.py``): a router
reads a real worker's ``/info`` and ``/kv/events`` through the same types the worker answers
with, and a server on a worker's port that answers with something else is taken for no worker
(never half-read: no hash recipe, no residency taken from it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from engines.messages import KVEvents, WorkerInfo
from engines.router.core import Router
from engines.testing import ThreadServer


@pytest.fixture(scope="module")
def impostor() -> Iterator[ThreadServer]:
    """Answers on a worker's routes, but not as a worker: ``/info`` lacks the hash recipe
    and ``/kv/events`` names its cursor as text."""
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/info")
    def info() -> dict[str, str]:
        return {"role": "both", "model_id": "m"}

    @app.get("/kv/events")
    def events() -> dict[str, object]:
        return {"cursor": "soon", "resync": False, "resident": [], "rates": {}, "events": []}

    server = ThreadServer(app).start()
    yield server
    server.stop()


def test_a_server_that_does_not_answer_as_a_worker_is_no_worker(impostor: ThreadServer) -> None:
    async def scenario() -> None:
        router = Router([impostor.url], policy="kv")
        await router.start(poll=False)
        w = router.workers[0]
        assert not w.known and router.hasher is None  # nothing taken from a partial /info
        assert not await router.learn(w)
        await router.sync(w)  # a malformed /kv/events changes nothing
        assert w.cursor == 0 and not w.resident
        await router.close()

    asyncio.run(scenario())


def test_the_types_refuse_what_a_worker_would_not_send() -> None:
    with pytest.raises(ValueError, match="hash_algo"):
        WorkerInfo.model_validate({"role": "both", "model_id": "m"})
    with pytest.raises(ValueError, match="cursor"):
        KVEvents.model_validate({"cursor": "soon", "resync": False, "resident": [],
                                 "rates": {}, "events": []})
