"""The worker's messages are one contract for both sides (``engines/messages.py``): a router
reads a real worker's ``/info`` and ``/kv/events`` through the same types the worker answers
with, and a server on a worker's port that answers with something else is taken for no worker
(never half-read: no hash recipe, no residency taken from it). The JSON of each generate
message is pinned here, as both sides read and write it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI

from engines.messages import (
    FirstToken,
    GenerateReply,
    GenerateRequest,
    KVEvents,
    PrefixHit,
    StreamError,
    Token,
    WorkerInfo,
    read_event,
)
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


HIT: dict[str, Any] = {"prompt_tokens": 26, "cached_tokens": 24, "local_hit_tokens": 0,
                       "store_hit_tokens": 24, "ttft_s": 0.5, "queue_s": 0.25,
                       "load_s": 0.125, "prefill_s": 0.125}


def test_a_generate_request_sends_only_what_its_sender_set() -> None:
    """The body a router sends: every sampling field it chose (a ``None`` seed included),
    the salt and the handoff only when there is one, ``stream`` only when streaming."""
    req = GenerateRequest(prompt_ids=[1, 2], max_tokens=8, temperature=0.0, top_p=1.0,
                          seed=None, ignore_eos=True, stop_token_ids=[2])
    assert json.loads(req.wire()) == {"prompt_ids": [1, 2], "max_tokens": 8,
                                      "temperature": 0.0, "top_p": 1.0, "seed": None,
                                      "ignore_eos": True, "stop_token_ids": [2]}
    handoff = req.model_copy(update={"block_hashes": ["ab"], "cache_salt": "s",
                                     "stream": True})
    assert json.loads(handoff.wire()) == {**json.loads(req.wire()), "block_hashes": ["ab"],
                                          "cache_salt": "s", "stream": True}
    assert GenerateRequest.model_validate_json(handoff.wire()) == handoff


def test_the_generate_reply_and_stream_events_keep_their_json() -> None:
    reply = GenerateReply(**HIT, token_ids=[5, 6], finish_reason="length", latency_s=1.0)
    assert json.loads(reply.model_dump_json()) == {**HIT, "token_ids": [5, 6],
                                                   "finish_reason": "length",
                                                   "latency_s": 1.0}
    first = FirstToken(**HIT, token_id=5)
    assert json.loads(first.model_dump_json()) == {"token_id": 5, **HIT}
    assert first.hit() == PrefixHit(**HIT)
    assert json.loads(Token(token_id=6).model_dump_json()) == {"token_id": 6}
    assert json.loads(StreamError(error="boom").model_dump_json()) == {"error": "boom"}
    # what the router reads back is the event the worker sent, by its keys
    for event in (first, Token(token_id=6), reply, StreamError(error="boom")):
        assert read_event(event.model_dump_json()) == event
    with pytest.raises(ValueError):
        read_event('{"token_id": "six"}')
    with pytest.raises(ValueError):
        read_event("[1]")
