"""End to end with real processes: two ``kvstore serve`` nodes in a cluster over a real
``redis-server``, a worker beside each, and ``kvstore-router --cluster`` in front. Each worker
reports its node; a router started after the prefix was stored (it has seen no event of it)
sends a request whose prefix only one node holds to the worker beside that node, which loads
it; the answer is the same tokens the other worker computes from scratch. The workers talk to
their nodes with a tenant's token, so the store (and the cluster's index) holds their blocks
under ``tenant~namespace``: the name each worker reports, and the router looks up."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import httpx
import pytest

from engines.testing import engine_proc, router_proc
from kvstore.testing.redis_server import RedisServer
from kvstore.testing.server import ServerProc

pytestmark = pytest.mark.slow

ARGS = ("--block-size", "4", "--num-blocks", "24")  # 24 blocks: one prompt's worth of room
_rng = random.Random(3)
PROMPT = [_rng.randrange(1, 60) for _ in range(41)]  # 10 full blocks


def loaded(worker_url: str) -> int:
    return int(httpx.get(f"{worker_url}/stats").json()["engine"]["kvstore"]["loaded_blocks"])


def test_the_router_sends_a_prefix_to_the_worker_beside_its_node(
        gqa_model: Path, tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    secrets = {"tenants.json": json.dumps({"acme": "acme-token-0123456789"}),
               "cluster": "cluster-token-0123456789", "acme": "acme-token-0123456789"}
    for name, text in secrets.items():
        (tmp_path / name).write_text(text)
        os.chmod(tmp_path / name, 0o600)
    procs: list = []
    try:
        nodes = [ServerProc(tmp_path / f"n{i}", "--cluster", redis.url, "--node-id", f"n{i}",
                            "--cluster-heartbeat-s", "0.2",
                            "--tenant-tokens-file", str(tmp_path / "tenants.json"),
                            "--cluster-token-file", str(tmp_path / "cluster")).start()
                 for i in (1, 2)]
        procs += nodes
        args = (*ARGS, "--kvstore-token-file", str(tmp_path / "acme"))
        w1, w2 = (engine_proc(gqa_model, kvstore=n.url, args=args).start(False) for n in nodes)
        procs += [w1, w2]
        w1.wait_ready()
        w2.wait_ready()
        info = httpx.get(f"{w1.url}/info").json()
        assert info["kvstore_node"] == "n1"
        assert info["kvstore_namespace"] == f"acme~{info['namespace']}"
        assert httpx.get(f"{w2.url}/info").json()["kvstore_node"] == "n2"
        body = {"prompt_ids": PROMPT, "max_tokens": 4, "ignore_eos": True}
        want = httpx.post(f"{w2.url}/generate", json=body, timeout=120).json()["token_ids"]
        for seed in range(8):  # other prompts push PROMPT out of w2's own cache
            other = [random.Random(seed).randrange(60, 120) for _ in range(41)]
            httpx.post(f"{w2.url}/generate", json={**body, "prompt_ids": other}, timeout=120)
        time.sleep(0.5)  # the index lags a node by 0.1 s plus a round trip
        before = loaded(w1.url), loaded(w2.url)
        router = router_proc([w1.url, w2.url], args=("--cluster", redis.url,
                                                     "--cluster-heartbeat-s", "0.2")).start()
        procs.append(router)
        r = httpx.post(f"{router.url}/v1/completions", timeout=120, json={
            "prompt": PROMPT + [5, 6, 7, 8], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200, r.text + router.log()
        # w2 took it and loaded the prefix from n2; w1 did nothing
        assert loaded(w2.url) > before[1] and loaded(w1.url) == before[0], router.log()
        again = httpx.post(f"{w1.url}/generate", json=body, timeout=120).json()["token_ids"]
        assert again == want  # w1 reads the same prefix through n1 from n2: same tokens
        assert loaded(w1.url) > before[0]
    finally:
        for proc in procs:
            proc.stop()
        redis.stop()
