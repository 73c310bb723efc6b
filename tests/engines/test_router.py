"""The router sends a request with a cached prefix to the worker that holds it, falls back
when that worker is down, round-robins as the baseline, and streams OpenAI-style SSE."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.testing import ThreadServer as LiveServer
from engines.worker import create_app as worker_app
from kvstore.testing.proc import free_port
from tests.engines.conftest import WORDS, make_tokenizer

ECFG = EngineConfig(block_size=4, num_blocks=96, max_batch_tokens=64)
SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]


@pytest.fixture
def workers(gqa_model: Path) -> Iterator[list[LiveServer]]:
    live = [LiveServer(worker_app(Engine(gqa_model, ECFG))).start() for _ in range(2)]
    yield live
    for s in live:
        s.stop()


def complete(c: TestClient, prompt: list[int], **kw: object) -> dict:
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                        "ignore_eos": True, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_cached_prefix_goes_to_its_worker_and_falls_back(
        gqa_model: Path, workers: list[LiveServer]) -> None:
    urls = [w.url for w in workers]
    with TestClient(router_app(Router(urls, policy="kv"))) as c:
        first = complete(c, SYSTEM + [40, 41])
        home = first["kvstore"][0]["worker"]
        for tail in ([50, 51, 52], [60], [70, 71]):
            doc = complete(c, SYSTEM + tail)
            assert doc["kvstore"][0]["worker"] == home
            assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 20
        other = complete(c, [90, 91, 92, 93, 94, 95, 96, 1, 2])  # no overlap: the idle rotation
        assert other["kvstore"][0]["worker"] in urls

        workers[urls.index(home)].stop()
        doc = complete(c, SYSTEM + [80, 81])
        assert doc["kvstore"][0]["worker"] != home
        want = Engine(gqa_model, ECFG).generate([SYSTEM + [80, 81]],
                                                SamplingParams(max_tokens=4, ignore_eos=True))
        assert doc["choices"][0]["token_ids"] == want[0]
        stats = c.get("/stats").json()
        assert stats["workers"][home]["failures"] >= 1
        assert stats["workers"][home]["routed"] >= 4
        assert stats["hit_tokens"] >= 60


def test_ready_needs_a_prefill_worker_when_there_are_prefill_workers(
        workers: list[LiveServer]) -> None:
    """A request needs a prefill worker too then: ``ready`` is what a client may wait for."""
    nobody = f"http://127.0.0.1:{free_port()}"
    with TestClient(router_app(Router([workers[0].url], prefill_workers=[nobody]))) as c:
        assert c.get("/health").json()["ready"] is False
        r = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
        assert r.status_code == 503 and "prefill" in r.json()["error"]["message"], r.text
    with TestClient(router_app(Router([workers[0].url]))) as c:
        assert c.get("/health").json()["ready"] is True


def test_round_robin_alternates_and_streams(gqa_model: Path,
                                            workers: list[LiveServer]) -> None:
    urls = [w.url for w in workers]
    with TestClient(router_app(Router(urls, policy="round-robin"))) as c:
        seen = [complete(c, SYSTEM + [40 + i])["kvstore"][0]["worker"] for i in range(4)]
        assert seen[0] != seen[1] and seen[0] == seen[2] and seen[1] == seen[3]

        body = {"prompt": SYSTEM, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as s:
            data = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        tokens = [t for ch in chunks for t in ch["choices"][0]["token_ids"]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert tokens == complete(c, SYSTEM, max_tokens=5)["choices"][0]["token_ids"]
        assert c.post("/v1/completions", json={"prompt": "hi"}).status_code == 400


def test_text_prompts_with_a_tokenizer(gqa_model: Path, workers: list[LiveServer],
                                       tmp_path: Path) -> None:
    make_tokenizer(tmp_path)
    with TestClient(router_app(Router([w.url for w in workers]), str(tmp_path))) as c:
        text = " ".join(WORDS[t] for t in SYSTEM)
        doc = complete(c, text)  # type: ignore[arg-type]
        ids = doc["choices"][0]["token_ids"]
        assert ids == complete(c, SYSTEM)["choices"][0]["token_ids"]
        specials = {0, 1, 2}  # decoded without special tokens (unk, bos, eos)
        assert doc["choices"][0]["text"].split() == [WORDS[t] for t in ids if t not in specials]
