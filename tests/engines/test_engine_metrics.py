"""``/metrics`` of the engine worker and of the router, scraped after real requests: the
routing decisions and hit tokens match ``/stats``, every token shows in the TTFT and
inter-token histograms, and the renamed gauges are there under their old names too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.testing import ThreadServer
from engines.worker import create_app as worker_app

ECFG = EngineConfig(block_size=4, num_blocks=96, max_batch_tokens=64)
PREFIX = list(range(11, 31))


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, keyed by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def worker(gqa_model: Path) -> Iterator[ThreadServer]:
    live = ThreadServer(worker_app(Engine(gqa_model, ECFG))).start()
    yield live
    live.stop()


def test_router_and_worker_metrics_count_real_requests(worker: ThreadServer) -> None:
    with TestClient(router_app(Router([worker.url], policy="kv"))) as c:
        for tail in ([40, 41], [50, 51], [60, 61]):
            r = c.post("/v1/completions", json={"prompt": PREFIX + tail, "max_tokens": 5,
                                                "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
        with c.stream("POST", "/v1/completions", json={
                "prompt": PREFIX + [70], "max_tokens": 5, "temperature": 0,
                "ignore_eos": True, "stream": True}) as s:
            assert s.status_code == 200
            s.read()
        stats = c.get("/stats").json()
        router_page = c.get("/metrics").text
    got = samples(router_page)
    w = worker.url
    assert got[("kvstore_router_decisions_total",
                (("outcome", "routed"), ("policy", "kv"), ("worker", w)))] == 4
    assert got[("kvstore_router_requests_total", (("policy", "kv"),))] == stats["requests"] == 4
    hit = stats["workers"][w]["hit_tokens"]
    assert hit >= 3 * 20 - 3 * 4  # the shared prefix, less at most the last partial block
    assert got[("kvstore_router_hit_tokens_total", (("worker", w),))] == hit
    assert got[("kvstore_router_worker_up", (("role", "both"), ("worker", w)))] == 1
    assert got[("kvstore_router_ttft_seconds_count", ())] == 4
    assert got[("kvstore_router_itl_seconds_count", ())] == 4 * 4  # 5 tokens: 4 gaps each
    inflight = (("worker", w),)
    assert got[("kvstore_router_worker_inflight_requests", inflight)] == 0
    assert got[("kvstore_router_worker_inflight", inflight)] == 0  # deprecated, still there

    page = httpx.get(f"{w}/metrics").text
    wk = samples(page)
    role = (("role", "both"),)
    assert wk[("kvstore_worker_requests_total", role)] == 4
    assert wk[("kvstore_worker_generated_tokens_total", role)] == 20
    assert wk[("kvstore_worker_local_hit_tokens_total", role)] == hit
    assert wk[("kvstore_worker_ttft_seconds_count", ())] == 4
    assert wk[("kvstore_worker_itl_seconds_count", ())] == 16
    assert wk[("kvstore_worker_ttft_seconds_sum", ())] > 0
    for gauge in ("running", "waiting", "inflight"):
        assert wk[(f"kvstore_worker_{gauge}_requests", role)] == 0
        assert wk[(f"kvstore_worker_{gauge}", role)] == 0
        assert f"# HELP kvstore_worker_{gauge} deprecated: use kvstore_worker_{gauge}_requests" \
            in page
    assert "# HELP kvstore_router_worker_inflight deprecated: use " \
           "kvstore_router_worker_inflight_requests" in router_page
