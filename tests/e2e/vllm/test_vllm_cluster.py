"""End to end across a cluster: an engine beside node 1 stores prompts; a fresh engine beside
node 2, which never saw them, loads their prefixes from node 1 through its own node (the
connector talks to its local node only) and generates exactly the tokens the first engine
computed without any cache.

Two real ``kvstore serve`` nodes, one real ``redis-server``, two real vLLM engines.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore.protocol.cluster import ClusterStatus, NodeState
from kvstore.testing.redis_server import RedisServer
from kvstore.testing.server import ServerProc

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

BLOCK = 32
_rng = random.Random(11)


def _tokens(n: int) -> list[int]:
    return [_rng.randrange(1, 500) for _ in range(n)]


P1, P2 = _tokens(96), _tokens(150)
SUF = _tokens(40)
STORED = [P1, P2]
ASKED = [P1 + SUF, P2[:100] + SUF, SUF + P1]


def status(node: ServerProc) -> ClusterStatus:
    return ClusterStatus.model_validate(httpx.get(node.url + "/v1/cluster", timeout=10).json())


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProc]]:
    root = tmp_path_factory.mktemp("cluster")
    redis = RedisServer(root / "redis").start()
    made = [ServerProc(Path(root) / f"n{i}", "--cluster", redis.url, "--node-id", f"n{i}",
                       "--cluster-heartbeat-s", "0.2", host_capacity="256MiB")
            for i in (1, 2)]
    try:
        for node in made:
            node.start()
        deadline = time.monotonic() + 30
        while [n.state for n in status(made[0]).nodes] != [NodeState.UP] * 2:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield made
    finally:
        for node in made:
            node.stop()
        redis.stop()


def test_a_fresh_engine_loads_from_a_peer_node_and_matches(
        tiny_llama: str, nodes: list[ServerProc], engine: Any, make_spec: Any,
        hit_tokens: Any) -> None:
    n1, n2 = nodes
    a = engine(make_spec(tiny_llama, "float32", n1.url))
    out = a.generate(STORED + ASKED)["tokens"]  # n1 is empty: computed from scratch
    a.close()  # its blocks are stored (on n1 only) before it exits
    baseline = dict(zip(map(tuple, STORED + ASKED), out, strict=True))
    stored = [p + o[:-1] for p, o in zip(STORED + ASKED, out, strict=True)]
    time.sleep(0.5)  # the index lags a node by 0.1 s plus a round trip
    b = engine(make_spec(tiny_llama, "float32", n2.url))
    result = b.generate(ASKED)
    expected = [hit_tokens(p, stored) for p in ASKED]
    assert expected == [128, 128, 128]  # every full block but the one with the last token
    assert result["cached"] == expected
    assert result["tokens"] == [baseline[tuple(p)] for p in ASKED]
    assert status(n2).fetched.blocks >= 6  # the loaded blocks came through n2 from n1
