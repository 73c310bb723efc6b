"""End to end, bfloat16: blocks stored by one engine load into a fresh one (in vLLM's
in-process mode, with asynchronous loads: the float32 module runs the default synchronous
ones) and the tokens equal the baseline's.

bfloat16 pages are packed differently from float32 ones on CPU (AMX tiles where the CPU has
AMX), so this checks that whole-page copies round-trip whatever the packing, and that the
namespace keeps the two dtypes apart (this module's server sees only bfloat16 blocks).
"""

from __future__ import annotations

import json
import random
import urllib.request
from typing import Any

import pytest

# Module fixtures start several engines (tens of seconds each on two busy cores).
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

_rng = random.Random(7)


def _tokens(n: int) -> list[int]:
    return [_rng.randrange(1, 500) for _ in range(n)]


P1 = _tokens(64)  # exactly 2 blocks
P2 = _tokens(170)  # 5 blocks and 10 tokens
SUF = _tokens(33)
STORED = [P1, P2]
ASKED = [
    P1 + SUF,  # a whole stored prompt, then new tokens
    P2[:140] + SUF,  # 4 of the 5 stored blocks of P2
    P2,  # a whole stored prompt that is not a multiple of the block size
    SUF + P2,  # no stored prefix
]


def test_bfloat16_fresh_engine_loads_stored_prefixes_and_matches_baseline(
    tiny_llama: str, kvstore_server: Any, engine: Any, make_spec: Any, hit_tokens: Any,
    op_count: Any,
) -> None:
    every = STORED + ASKED
    base = engine(make_spec(tiny_llama, "bfloat16", None))
    baseline = base.generate(every)["tokens"]
    base.close()

    a = engine(make_spec(tiny_llama, "bfloat16", kvstore_server.url))
    out_a = a.generate(STORED)["tokens"]
    a.close()
    assert out_a == baseline[: len(STORED)]
    stored = [p + o[:-1] for p, o in zip(STORED, out_a, strict=True)]

    b = engine(make_spec(tiny_llama, "bfloat16", kvstore_server.url, load_mode="async"))
    acquires = op_count(kvstore_server.url, "shm_acquire")
    result = b.generate(ASKED)
    # every stored block is in kvstore's RAM: the scheduler's lookups were granted their
    # places in the shared slab and the worker asked kvstore for nothing
    assert op_count(kvstore_server.url, "shm_acquire") == acquires
    expected = [hit_tokens(p, stored, sync=False) for p in ASKED]
    assert expected == [64, 128, 160, 0]
    assert result["cached"] == expected
    metrics = result["metrics"]
    assert metrics["vllm:external_prefix_cache_hits"] == sum(expected)
    # The connector's own counters, through vLLM's connector stats hooks.
    assert metrics["vllm:kvstore_hit_tokens"] == sum(expected)
    assert metrics["vllm:kvstore_loaded_blocks"] == sum(expected) // 32
    assert metrics["vllm:kvstore_load_errors"] == 0
    assert result["tokens"] == baseline[len(STORED) :]

    with urllib.request.urlopen(f"{kvstore_server.url}/v1/namespaces", timeout=10) as resp:
        namespaces = json.load(resp)["namespaces"]
    (ns,) = namespaces
    assert ns["layout"]["dtype"] == "bfloat16"
    assert ns["layout"]["layout_name"].startswith("cpu_attn:")
