"""``cache_salt`` through kvstore, with real processes: two workers sharing one
``kvstore serve`` behind a round-robin router. A prompt one user's worker saved to kvstore is
loaded by the other worker for the same salt only; another salt, or none, finds nothing there
(its hashes differ from the first block on), so ``cached_tokens`` tells no one else of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.testing import engine_proc, router_proc
from kvstore.testing.server import ServerProc
from tests.engines.conftest import make_checkpoint

pytestmark = pytest.mark.slow

ARGS = ("--block-size", "4", "--num-blocks", "128")
PROMPT = list(range(30, 56))  # 6 full blocks and 2 tokens


def test_kvstore_hits_stay_within_one_salt(tmp_path: Path) -> None:
    model = make_checkpoint(tmp_path / "model")
    store = ServerProc(tmp_path / "kv").start()
    procs = []
    try:
        a = engine_proc(model, kvstore=store.url, args=ARGS).start(False)
        b = engine_proc(model, kvstore=store.url, args=ARGS).start(False)
        procs += [a, b]
        a.wait_ready()
        b.wait_ready()
        router = router_proc([a.url, b.url], policy="round-robin").start()
        procs.append(router)

        def hit(salt: str | None) -> tuple[str, int, int]:
            body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
            if salt is not None:
                body["cache_salt"] = salt
            r = httpx.post(f"{router.url}/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text + router.log()
            doc = r.json()
            worker = doc["kvstore"][0]["worker"]
            stats = httpx.get(f"{worker}/stats", timeout=30).json()["engine"]
            return worker, doc["usage"]["prompt_tokens_details"]["cached_tokens"], \
                stats["store_hit_tokens"]

        first, cached, _ = hit("alice")  # computed on one worker, saved to kvstore
        assert cached == 0
        other, cached, store_hits = hit("bob")  # the other worker: nothing for bob in kvstore
        assert other != first and cached == 0 and store_hits == 0
        again, cached, _ = hit(None)  # nor without a salt, on alice's own worker
        assert again == first and cached == 0
        other_again, cached, store_hits = hit("alice")  # alice's blocks, from kvstore
        assert other_again == other and cached == 24 and store_hits == 24
    finally:
        for p in procs:
            p.stop()
        store.stop()
