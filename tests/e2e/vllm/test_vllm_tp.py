"""End to end, tensor parallel (2 ranks on the CPU): each rank stores and loads its own shard
of every block, and a fresh engine's tokens equal the baseline's.

The scheduler looks up rank 0's namespace and its grant locates rank 0's shards in kvstore's
shared slab; rank 1 must not copy those (it would load rank 0's KV heads as its own), so it
fetches its shards from its own namespace. Engine B runs while every block is in kvstore's RAM,
so both paths run: rank 0 copies granted places, rank 1 fetches.
"""

from __future__ import annotations

import json
import os
import random
import urllib.request
from typing import Any

import pytest

from kvstore.keys import block_hashes

# Module fixtures start several engines (tens of seconds each on two busy cores).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks need two cores"),
]

BLOCK = 32
TP = 2
_rng = random.Random(11)


def _tokens(n: int) -> list[int]:
    return [_rng.randrange(1, 500) for _ in range(n)]


P1 = _tokens(96)  # exactly 3 blocks
P2 = _tokens(150)  # 4 blocks and 22 tokens
SUF = _tokens(40)
STORED = [P1, P2]
ASKED = [P1 + SUF, P2[:100] + SUF, P2 + SUF]


def _namespaces(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/v1/namespaces", timeout=10) as resp:
        return sorted(ns["name"] for ns in json.load(resp)["namespaces"])


def test_two_ranks_store_and_load_their_own_shards(
    tiny_llama: str, kvstore_server: Any, engine: Any, make_spec: Any, hit_tokens: Any,
    op_count: Any,
) -> None:
    base = engine(make_spec(tiny_llama, "float32", None))
    baseline = base.generate(STORED + ASKED)["tokens"]
    base.close()

    spec = make_spec(tiny_llama, "float32", kvstore_server.url)
    spec["tp"] = TP
    a = engine(spec, multiprocess=True)
    out_a = a.generate(STORED)["tokens"]
    a.close()  # its last blocks are stored before it exits
    assert out_a == baseline[: len(STORED)]
    stored = [p + o[:-1] for p, o in zip(STORED, out_a, strict=True)]

    # One namespace per rank, both holding every stored block, with different bytes (each
    # rank's shard holds other KV heads).
    names = _namespaces(kvstore_server.url)
    assert [n.rsplit(".", 1)[-1] for n in names] == ["tp0of2", "tp1of2"], names
    hashes = block_hashes(P1, BLOCK, seed=os.environ.get("PYTHONHASHSEED"))
    client = kvstore_server.client()
    try:
        shards = [client.get(ns, hashes) for ns in names]
    finally:
        client.close()
    assert all(b is not None for shard in shards for b in shard)
    assert all(x != y for x, y in zip(*shards, strict=True))

    grants = op_count(kvstore_server.url, "shm_lookup")
    b = engine(spec, multiprocess=True)
    result = b.generate(ASKED)
    expected = [hit_tokens(p, stored) for p in ASKED]
    assert expected == [96, 96, 128]  # the cases the prompts were built for
    assert result["cached"] == expected
    assert result["tokens"] == baseline[len(STORED) :]
    assert op_count(kvstore_server.url, "shm_lookup") > grants  # rank 0's loads were granted
    assert not any("could not be loaded" in line for line in b.lines), b.tail()
