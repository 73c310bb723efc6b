"""End to end, fp8 KV caches (``kv_cache_dtype`` ``fp8_e4m3`` and ``fp8_e5m2``, static scales):
the quantized pages round-trip byte for byte (a fresh engine's tokens equal the baseline's with
the same cache dtype), and the two dtypes, sharing one server and the same prompts, never read
each other's blocks.

vLLM 0.32's CPU fp8 cache needs x86 with AVX-512 or AMX; on other CPUs (the 2-core AMD
machines without AVX-512 included) the module is skipped, and ``tests/connectors/
test_segments.py`` covers what can be checked without an engine (namespaces per dtype, dynamic
scales refused).
"""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path
from typing import Any

import pytest


def _cpu_has_fp8_kernels() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512f" in flags or "amx_tile" in flags


pytestmark = [
    pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(1200),
    pytest.mark.skipif(not _cpu_has_fp8_kernels(),
                       reason="vLLM's CPU fp8 KV cache needs AVX-512 or AMX"),
]

_rng = random.Random(5)


def _tokens(n: int) -> list[int]:
    return [_rng.randrange(1, 500) for _ in range(n)]


P1 = _tokens(96)  # 3 blocks
P2 = _tokens(170)
SUF = _tokens(33)
STORED = [P1, P2]
ASKED = [P1 + SUF, P2[:100] + SUF, P2, SUF + P1]


@pytest.mark.parametrize("cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_round_trips_and_keeps_to_its_dtype(
    cache_dtype: str, tiny_llama: str, kvstore_server: Any, engine: Any, make_spec: Any,
    hit_tokens: Any,
) -> None:
    def spec(url: str | None) -> dict[str, Any]:
        s: dict[str, Any] = make_spec(tiny_llama, "float32", url)
        s["engine_args"] = {"kv_cache_dtype": cache_dtype}
        return s

    base = engine(spec(None))
    baseline = base.generate(STORED + ASKED)["tokens"]
    base.close()

    a = engine(spec(kvstore_server.url))
    out_a = a.generate(STORED)["tokens"]
    a.close()
    assert out_a == baseline[: len(STORED)]
    stored = [p + o[:-1] for p, o in zip(STORED, out_a, strict=True)]

    b = engine(spec(kvstore_server.url))
    result = b.generate(ASKED)
    b.close()
    expected = [hit_tokens(p, stored) for p in ASKED]
    assert expected == [96, 96, 160, 0]
    assert result["cached"] == expected
    assert result["tokens"] == baseline[len(STORED):]

    with urllib.request.urlopen(f"{kvstore_server.url}/v1/namespaces", timeout=10) as resp:
        layouts = [ns["layout"] for ns in json.load(resp)["namespaces"]]
    # one namespace per dtype run so far, each with its dtype: e5m2's engines (run second,
    # on the same prompts) got hits only from blocks they stored themselves
    assert cache_dtype in [lay["dtype"] for lay in layouts]
    assert len({lay["dtype"] for lay in layouts}) == len(layouts)
