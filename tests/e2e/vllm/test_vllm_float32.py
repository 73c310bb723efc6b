"""End to end, float32: a fresh vLLM engine gets its prefixes from kvstore and produces
exactly the baseline's tokens, also when a stored block is corrupt and when kvstore goes down
and comes back.

The story, shared by this module's tests (engines are what costs time):
1. a baseline engine (no connector, no prefix caching) computes the greedy tokens of every
   prompt used below;
2. engine A (connector) serves the prompts to be stored, and exits;
3. kvstore restarts from its data folder with one block of prompt ``E`` corrupted on disk;
4. engine B, a fresh process in vLLM's default multiprocess mode with the multiprocess
   executor (frontend, engine core with the connector's scheduler side, and a worker process
   with its worker side) serves the tests' prompts.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
from typing import Any

import pytest

from kvstore.keys import block_hashes

# Module fixtures start several engines (tens of seconds each on two busy cores).
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

BLOCK = 32
_rng = random.Random(5)


def _tokens(n: int) -> list[int]:
    return [_rng.randrange(1, 500) for _ in range(n)]


P1 = _tokens(96)  # exactly 3 blocks
P2 = _tokens(150)  # 4 blocks and 22 tokens
E = _tokens(150)  # its block 1 is corrupted on disk before engine B asks for it
R = _tokens(100)  # asked for only after kvstore restarted under a running engine
F = _tokens(90)  # never stored; asked for while kvstore is down
G = _tokens(70)  # the same
SUF = _tokens(40)
H = _tokens(128)  # read back into kvstore's RAM before engine B asks: a granted load
STORED = [P1, P2, E, R, H]
ASKED = [
    P1,  # the whole prompt is stored: its last block is computed, for its last token
    P1 + SUF,  # a stored prefix, then new tokens
    P2[:100] + SUF,  # a partial prefix of a stored prompt (3 of its 4 blocks)
    P2 + SUF,  # a stored prompt whose length is not a multiple of the block size
    P1[:64] + SUF,  # 2 blocks of a stored prompt, not at a prompt boundary
    SUF + P1,  # nothing in common with a stored prefix
]
E_ASKED = E + SUF
DOWN_ASKED = [F, G]
AFTER_RESTART = R + SUF
H_ASKED = H + SUF


@pytest.fixture(scope="module")
def story(
    tiny_llama: str, kvstore_server: Any, engine: Any, make_spec: Any, corrupt_block: Any
) -> dict[str, Any]:
    every = [*STORED, *ASKED, E_ASKED, *DOWN_ASKED, AFTER_RESTART, H_ASKED]
    base = engine(make_spec(tiny_llama, "float32", None))
    baseline = dict(zip(map(tuple, every), base.generate(every)["tokens"], strict=True))
    base.close()

    a = engine(make_spec(tiny_llama, "float32", kvstore_server.url))
    out_a = a.generate(STORED)["tokens"]
    a.close()  # its last blocks are stored before it exits
    # What A computed KV for: each prompt and every output token but the last.
    stored = [p + o[:-1] for p, o in zip(STORED, out_a, strict=True)]
    assert out_a == [baseline[tuple(p)] for p in STORED]

    h = block_hashes(E, BLOCK, seed=os.environ.get("PYTHONHASHSEED"))[1]
    corrupt_block(kvstore_server, _namespace(kvstore_server.url), h)

    # prefetch off: a prefetch would read (and drop) the corrupt block before the lookup,
    # turning the load error this module checks into a plain shorter hit.
    spec_b = make_spec(tiny_llama, "float32", kvstore_server.url, prefetch=False)
    # The multiprocess executor puts the model runner (worker side) in a process of its own,
    # so the connector metadata really crosses a process boundary.
    spec_b["executor"] = "mp"
    b = engine(spec_b, multiprocess=True)
    return {"baseline": baseline, "stored": stored, "b": b, "server": kvstore_server}


def _namespace(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/namespaces", timeout=10) as resp:
        names = [ns["name"] for ns in json.load(resp)["namespaces"]]
    (name,) = [n for n in names if n.startswith("vllm.")]
    return name


def test_fresh_engine_loads_stored_prefixes_and_matches_baseline(
    story: dict[str, Any], hit_tokens: Any
) -> None:
    result = story["b"].generate(ASKED)
    expected = [hit_tokens(p, story["stored"]) for p in ASKED]
    assert expected == [64, 96, 96, 128, 64, 0]  # the cases the prompts were built for
    # vLLM's per-request report (its Prometheus counters lag in multiprocess mode; the
    # bfloat16 module, in-process, checks them).
    assert result["cached"] == expected
    assert result["tokens"] == [story["baseline"][tuple(p)] for p in ASKED]


def test_corrupted_block_is_a_load_error_and_recomputed(story: dict[str, Any]) -> None:
    b = story["b"]
    result = b.generate([E_ASKED])
    assert result["tokens"] == [story["baseline"][tuple(E_ASKED)]]
    # Block 0 loads; block 1 fails its checksum in kvstore, so it and the blocks after it
    # (whose KV would extend a prefix the engine does not have) are reported to vLLM.
    assert any("3 of 4 stored blocks could not be loaded" in line for line in b.lines), b.tail()


def test_blocks_in_kvstore_ram_load_with_no_worker_round_trip(
    story: dict[str, Any], hit_tokens: Any, op_count: Any
) -> None:
    # The scheduler's lookup is granted the blocks' places in kvstore's shared slab and the
    # worker process copies them from its own mapping: no shm_acquire for this load.
    server = story["server"]
    ns = _namespace(server.url)
    hashes = block_hashes(H, BLOCK, seed=os.environ.get("PYTHONHASHSEED"))
    client = server.client()
    try:
        assert None not in client.get(ns, hashes)  # kvstore restarted: this promotes them
        assert client.lookup(ns, hashes)[1] == ["host"] * 4
    finally:
        client.close()
    acquires, grants = op_count(server.url, "shm_acquire"), op_count(server.url, "shm_lookup")
    result = story["b"].generate([H_ASKED])
    assert result["cached"] == [hit_tokens(H_ASKED, story["stored"])] == [128]
    assert result["tokens"] == [story["baseline"][tuple(H_ASKED)]]
    assert op_count(server.url, "shm_lookup") > grants
    assert op_count(server.url, "shm_acquire") == acquires


def test_kvstore_down_then_restarted_under_a_running_engine(
    story: dict[str, Any], hit_tokens: Any
) -> None:
    b, server, baseline = story["b"], story["server"], story["baseline"]
    server.stop()
    start = time.monotonic()
    down = b.generate(DOWN_ASKED)
    assert time.monotonic() - start < 30, "an unreachable kvstore must not stall the engine"
    assert down["tokens"] == [baseline[tuple(p)] for p in DOWN_ASKED]
    assert down["cached"] == [0, 0]

    server.start()  # same ports and data folder: A's blocks are back, from disk
    time.sleep(1.5)  # the connector waits out retry_after_s (1 s) before calling again
    back = b.generate([AFTER_RESTART])
    assert back["cached"] == [hit_tokens(AFTER_RESTART, story["stored"])] == [96]
    assert back["tokens"] == [baseline[tuple(AFTER_RESTART)]]
