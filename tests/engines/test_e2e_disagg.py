"""End to end with real processes: ``kvstore serve``, a prefill and a decode
``kvstore-engine serve``, and ``kvstore-router`` in front. Greedy tokens are identical between
single-process generation and disaggregated prefill -> decode through kvstore."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.testing import engine_proc, router_proc
from kvstore.testing.server import ServerProc

pytestmark = pytest.mark.slow

PROMPT = [7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3, 6, 0, 2, 8, 7, 4, 7]
ARGS = ("--block-size", "4", "--num-blocks", "64")


def test_disaggregated_serving_matches_single_process(gqa_model: Path, tmp_path: Path) -> None:
    want = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=64)).generate(
        [PROMPT], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    store = ServerProc(tmp_path / "kv").start()
    procs = []
    try:
        pre = engine_proc(gqa_model, role="prefill", kvstore=store.url, args=ARGS).start(False)
        dec = engine_proc(gqa_model, role="decode", kvstore=store.url, args=ARGS).start(False)
        procs += [pre, dec]
        pre.wait_ready()
        dec.wait_ready()
        router = router_proc([dec.url], prefill_workers=[pre.url], kvstore=store.url).start()
        procs.append(router)
        r = httpx.post(f"{router.url}/v1/completions", timeout=120, json={
            "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text + router.log()
        doc = r.json()
        assert doc["choices"][0]["token_ids"] == want
        # the decode worker computed only the tail: its prompt blocks came from kvstore
        assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 24
        stats = httpx.get(f"{dec.url}/stats").json()
        assert stats["engine"]["kvstore"]["loaded_blocks"] == 6
        assert stats["engine"]["computed_tokens"] == len(PROMPT) - 24 + 7
        # a salted prompt: the prefill worker hashes and stores it under the salt, and the
        # decode worker, checking the handoff against its own salted hashes, loads it
        r = httpx.post(f"{router.url}/v1/completions", timeout=120, json={
            "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "cache_salt": "alice"})
        assert r.status_code == 200, r.text + router.log()
        assert r.json()["choices"][0]["token_ids"] == want
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 24
        assert httpx.get(f"{dec.url}/stats").json()["engine"]["kvstore"]["loaded_blocks"] == 12

        # a separate `kvstore-engine generate` process also reuses the stored prefix
        out = subprocess.run(
            [sys.executable, "-c", "import sys; from engines.cli import main; sys.exit(main())",
             "generate", "--model", str(gqa_model), "--prompt-ids", json.dumps(PROMPT),
             "--max-tokens", "8", "--ignore-eos", "--kvstore", store.url, "--device", "cpu",
             *ARGS], capture_output=True, text=True, timeout=300, check=True)
        assert json.loads(out.stdout) == want
    finally:
        for p in procs:
            p.stop()
        store.stop()
