"""``/v1/explain`` is bounded in work and in the size of its answer: a prompt cut into more
blocks than an explain examines is refused before it is hashed, the largest one accepted costs
the server a bounded CPU time however many namespaces of other recipes there are, and the
answer carries at most 1024 block rows (``offset`` pages through the rest).

Before, one request of 262,144 tokens in blocks of 4 with 16 other recipes registered cost
7.5 s of CPU and answered 11.4 MB."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.testing.server import ServerProc
from server.rest.explain_schemas import MAX_EXPLAIN_TOKENS

TOKEN = "rest-explain-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOKENS = [random.Random(7).randrange(1 << 17) for _ in range(MAX_EXPLAIN_TOKENS)]


def _register(api: httpx.Client, name: str, block_size: int, seed: str | None = None) -> None:
    r = api.post("/v1/namespaces", json={
        "name": name, "block_bytes": 4096, "hash_algo": "sha256", "hash_seed": seed,
        "layout": {"model_id": "m", "block_size": block_size}})
    assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("rest-explain") / "data", "--token",
                      TOKEN).start()
    with httpx.Client(base_url=proc.url, headers=AUTH, timeout=60) as api:
        _register(api, "by4", 4)
        _register(api, "by16", 16)
        for i in range(16):  # 16 other recipes, each cutting the prompt into <= 16384 blocks
            _register(api, f"seed{i}", 16 + i % 2, seed=str(i))
    yield proc
    proc.stop()
    assert "Traceback" not in proc.log(200_000)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _explain(srv: ServerProc, name: str, **extra: object) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/explain", headers=AUTH, timeout=120,
                      json={"namespace": name, "tokens": TOKENS, **extra})


def test_a_prompt_of_too_many_blocks_is_refused_before_it_is_hashed(srv: ServerProc) -> None:
    assert srv.proc is not None
    before = _cpu_s(srv.proc.pid)
    r = _explain(srv, "by4")  # 65,536 blocks: max_batch allowed it
    cpu = _cpu_s(srv.proc.pid) - before
    assert r.status_code == 422, (r.status_code, len(r.content))
    assert "over the limit of 16384 blocks an explain examines (max_batch, " in r.text, r.text
    assert cpu < 1.5, f"a refused explain cost {cpu:.1f} s of CPU"


def test_the_largest_explain_is_bounded_in_cpu_and_in_bytes(srv: ServerProc) -> None:
    assert srv.proc is not None
    before = _cpu_s(srv.proc.pid)
    r = _explain(srv, "by16")  # 16,384 blocks, the most an explain examines
    cpu = _cpu_s(srv.proc.pid) - before
    assert r.status_code == 200, r.text[:500]
    doc = r.json()
    assert sum(doc["counts"].values()) == 16384  # the summary is the whole prompt's
    assert len(doc["blocks"]) == 1024 and doc["next_offset"] == 1024
    assert len(r.content) < 1 << 20, f"the answer is {len(r.content)} bytes"
    assert cpu < 2.5, f"one explain cost {cpu:.1f} s of CPU"
    last = _explain(srv, "by16", offset=16000, limit=1024).json()
    assert [b["index"] for b in last["blocks"]] == list(range(16000, 16384))
    assert last["next_offset"] is None
    r = _explain(srv, "by16", limit=1025)
    assert r.status_code == 422 and "limit" in r.json()["message"], r.text
