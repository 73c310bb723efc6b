"""HTTP worker and disaggregated prefill -> decode in one process (shared in-process Store);
the CLI's generate."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from engines.cli import main
from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.store_io import LocalStore
from engines.testing import ThreadServer as LiveServer
from engines.worker import create_app
from kvstore.config import StoreConfig, TierConfig
from kvstore.store import Store

ECFG = EngineConfig(block_size=4, num_blocks=96, max_batch_tokens=32)
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 8]


@pytest.fixture
def store(gqa_model: Path) -> Iterator[Store]:
    slot = Engine(gqa_model, ECFG).block_bytes
    s = Store(StoreConfig((TierConfig("host", 256 * slot, options={"slot_bytes": slot}),)))
    yield s
    s.close()


def single(model: Path, n: int = 8) -> list[int]:
    return Engine(model, ECFG).generate([PROMPT], SamplingParams(max_tokens=n,
                                                                 ignore_eos=True))[0]


def worker(model: Path, store: Store | None, role: str = "both") -> TestClient:
    engine = Engine(model, ECFG, LocalStore(store) if store is not None else None)
    return TestClient(create_app(engine, role))


def test_generate_and_stream(gqa_model: Path) -> None:
    want = single(gqa_model)
    with worker(gqa_model, None) as c:
        r = c.post("/generate", json={"prompt_ids": PROMPT, "max_tokens": 8,
                                      "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["token_ids"] == want
        body = {"prompt_ids": PROMPT, "max_tokens": 8, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/generate", json=body) as s:
            lines = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        assert [json.loads(x)["token_id"] for x in lines[:-2]] == want
        # the first event carries the prefix hit: here the prompt's full blocks from the
        # request above, all but the last token's block
        assert json.loads(lines[0])["cached_tokens"] == (len(PROMPT) - 1) // 4 * 4
        assert json.loads(lines[0])["prompt_tokens"] == len(PROMPT)
        # and where its time to first token went: no kvstore here, so no load; waiting and
        # prefill are measured on one clock and fit inside the request's latency
        first, last = json.loads(lines[0]), json.loads(lines[-2])
        assert first["load_s"] == 0.0
        assert first["queue_s"] >= 0 and first["prefill_s"] > 0
        assert first["queue_s"] + first["prefill_s"] < last["latency_s"]
        assert json.loads(lines[-2])["finish_reason"] == "length"
        assert c.post("/generate", json={"prompt_ids": [1000]}).status_code == 400
        r = c.post("/generate", json={"prompt_ids": PROMPT, "max_tokens": 400})
        assert r.status_code == 400 and "19 prompt tokens + max_tokens 400 = 419 tokens, and " \
            "the cache holds 384 (96 blocks of 4 tokens)" in r.json()["detail"], r.text
        assert c.post("/prefill", json={"prompt_ids": PROMPT}).status_code == 409  # no store


def test_a_stream_whose_caller_leaves_is_aborted(gqa_model: Path) -> None:
    server = LiveServer(create_app(Engine(gqa_model, ECFG))).start()
    try:
        body = {"prompt_ids": PROMPT, "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as s:
            next(s.iter_lines())  # the first token, then hang up
        deadline = time.monotonic() + 30
        while (stats := httpx.get(f"{server.url}/stats").json())["inflight"]:
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
        engine = stats["engine"]
        assert engine["running"] == 0 and engine["free_blocks"] == ECFG.num_blocks
        assert engine["computed_tokens"] < len(PROMPT) + 200, engine  # not run to the end
    finally:
        server.stop()


def test_disaggregated_prefill_then_decode(gqa_model: Path, store: Store) -> None:
    want = single(gqa_model)
    with worker(gqa_model, store, "prefill") as pre, worker(gqa_model, store, "decode") as dec:
        h = pre.post("/prefill", json={"prompt_ids": PROMPT})
        assert h.status_code == 200, h.text
        handoff = h.json()
        assert len(handoff["block_hashes"]) == len(PROMPT) // 4
        assert set(handoff) >= {"prompt_ids", "block_hashes", "namespace"}
        assert pre.post("/generate", json={"prompt_ids": PROMPT}).status_code == 409
        r = dec.post("/generate", json={"prompt_ids": PROMPT, "max_tokens": 8,
                                        "ignore_eos": True,
                                        "block_hashes": handoff["block_hashes"]})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["token_ids"] == want
        assert doc["store_hit_tokens"] == (len(PROMPT) - 1) // 4 * 4  # KV came from kvstore
        bad = ["00" * 32] + handoff["block_hashes"][1:]
        r = dec.post("/generate", json={"prompt_ids": PROMPT, "block_hashes": bad})
        assert r.status_code == 409
        ev = dec.get("/kv/events", params={"since": 0}).json()
        assert {e["hash"] for e in ev["events"] if e["stored"]} >= set(handoff["block_hashes"][:4])
        assert dec.get("/info").json()["block_size"] == 4


def test_cli_generate(gqa_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["generate", "--model", str(gqa_model), "--prompt-ids", json.dumps(PROMPT),
               "--max-tokens", "5", "--ignore-eos", "--device", "cpu", "--block-size", "16"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out) == single(gqa_model, 5)


def test_cli_refuses_cuda_without_a_gpu(gqa_model: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = main(["generate", "--model", str(gqa_model), "--prompt-ids", "[1, 2]",
               "--device", "cuda"])
    assert rc == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_stats_waiting_for_the_engine_lock_leaves_other_requests_alone(gqa_model: Path) -> None:
    """``/stats`` takes the engine lock, which a forward step holds for its whole length; the
    wait must not stall the worker's event loop (and with it ``/health`` and every stream)."""
    import threading

    engine = Engine(gqa_model, ECFG)
    entered, release = threading.Event(), threading.Event()
    real = engine.stats

    def slow_stats() -> dict[str, object]:  # stands for a long step: called under the lock
        entered.set()
        assert release.wait(30)
        return real()

    engine.stats = slow_stats  # type: ignore[method-assign]
    server = LiveServer(create_app(engine)).start()
    try:
        got: list[int] = []
        t = threading.Thread(target=lambda: got.append(
            httpx.get(f"{server.url}/stats", timeout=60).status_code))
        t.start()
        assert entered.wait(30)
        try:
            assert httpx.get(f"{server.url}/health", timeout=5).json()["ok"] is True
        finally:
            release.set()
            t.join(60)
        assert got == [200]
    finally:
        server.stop()
