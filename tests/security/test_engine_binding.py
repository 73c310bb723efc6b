"""The engine side is closed by default: ``kvstore-engine serve`` and ``kvstore-router`` refuse
to bind beyond loopback without a token (one line, exit code 2, as ``kvstore serve``); with a
token (``--token-file``) every route but ``/health`` needs it, the router presents the workers'
token when it calls them, and a worker's admin route (``POST /admin/role``) is closed without a
token and needs it with one. Real processes on loopback."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.testing import Proc, ThreadServer, engine_proc, router_proc
from engines.tiny_model import WIDE_LOGITS, llama_config, write_checkpoint
from engines.worker import create_app as worker_app
from kvstore.testing.cli import assert_one_line
from kvstore.testing.proc import console_script, free_port

WORKER_TOKEN = "worker-s3cret"
ROUTER_TOKEN = "router-s3cret"


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=97,
                          max_position_embeddings=512)
    return write_checkpoint(tmp_path_factory.mktemp("model"), config, seed=0,
                            logit_scale=WIDE_LOGITS)


@pytest.mark.parametrize("command", ["engine", "router"])
def test_binding_beyond_loopback_needs_a_token(command: str, tmp_path: Path) -> None:
    if command == "engine":  # refused before the model would load (there is none here)
        cmd = [*console_script("kvstore-engine", "engines.cli"), "serve", "--model",
               str(tmp_path / "no-model"), "--device", "cpu"]
    else:
        cmd = [*console_script("kvstore-router", "engines.router.cli"), "--workers",
               "http://127.0.0.1:9"]
    done = subprocess.run([*cmd, "--host", "0.0.0.0", "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)
    assert_one_line(done, "--host 0.0.0.0", "token", "--token-file")
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    done = subprocess.run([*cmd, "--host", "0.0.0.0", "--port", str(free_port()),
                           "--token-file", str(empty)], capture_output=True, text=True,
                          timeout=120)
    assert_one_line(done, "--token-file", "one token")


def test_admin_route_is_closed_without_a_token(model: Path) -> None:
    w = ThreadServer(worker_app(Engine(model, EngineConfig(block_size=4, num_blocks=64)),
                                role="both")).start()
    try:
        r = httpx.post(f"{w.url}/admin/role", json={"role": "decode"}, timeout=30)
        assert r.status_code == 403, r.text
        assert "--token-file" in r.json()["detail"]
        assert httpx.get(f"{w.url}/info", timeout=30).json()["role"] == "both"
    finally:
        w.stop()


@pytest.fixture(scope="module")
def fleet(model: Path) -> Iterator[tuple[Proc, Proc]]:
    worker = engine_proc(model, args=("--block-size", "4", "--num-blocks", "64"),
                         token=WORKER_TOKEN).start()
    router = router_proc([worker.url], token=ROUTER_TOKEN, worker_token=WORKER_TOKEN).start()
    try:
        yield worker, router
    finally:
        router.stop()
        worker.stop()


def test_a_worker_with_a_token_needs_it_everywhere_but_health(fleet: tuple[Proc, Proc]) -> None:
    worker, _ = fleet
    assert httpx.get(f"{worker.url}/health", timeout=30).status_code == 200
    for method, path, body in (("GET", "/info", None), ("GET", "/stats", None),
                               ("POST", "/generate", {"prompt_ids": [5], "max_tokens": 1}),
                               ("POST", "/admin/role", {"role": "decode"})):
        for headers in ({}, auth("wrong"), auth(ROUTER_TOKEN)):
            r = httpx.request(method, f"{worker.url}{path}", json=body, headers=headers,
                              timeout=30)
            assert r.status_code == 401, (path, headers, r.text)
    r = httpx.post(f"{worker.url}/admin/role", json={"role": "both"}, timeout=30,
                   headers=auth(WORKER_TOKEN))
    assert r.status_code == 200 and r.json()["role"] == "both"


def test_the_router_needs_its_token_and_sends_the_workers(fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    assert httpx.get(f"{router.url}/health", timeout=30).status_code == 200
    body = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
    for headers in ({}, auth("wrong"), auth(WORKER_TOKEN)):
        r = httpx.post(f"{router.url}/v1/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(f"{router.url}/v1/completions", json=body, headers=auth(ROUTER_TOKEN),
                   timeout=120)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["token_ids"]) == 2
    r = httpx.post(f"{router.url}/v1/completions", json={**body, "stream": True},
                   headers=auth(ROUTER_TOKEN), timeout=120)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text

