"""``docs/grafana/kvstore.json`` is a Grafana dashboard whose every query names metrics that
kvstore exports under their current names: the names are checked against real ``/metrics``
pages of a ``kvstore serve`` (host, disk and S3 tiers, under traffic), a router and an engine
worker, and none is a deprecated name (those pages still export each renamed series under its
old name too, its HELP saying which name replaces it)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engines.router.metrics import RENAMED as ROUTER_RENAMED
from engines.testing import ThreadServer
from engines.worker_metrics import RENAMED as WORKER_RENAMED
from kvstore.testing.traffic import busy_server
from server.metrics import RENAMED as SERVER_RENAMED
from tests.engines.conftest import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "kvstore.json"
METRIC = re.compile(r"\b(?:kvstore|process|python)_[A-Za-z0-9_:]+")
RENAMED = SERVER_RENAMED | WORKER_RENAMED | ROUTER_RENAMED  # new family name -> old
DEPRECATED = "deprecated: use "


class Family(NamedTuple):
    type: str
    help: str


def exported(url: str) -> dict[str, Family]:
    """Every sample name on ``url``'s ``/metrics`` page (``_total``, ``_bucket``... included)
    and the type and HELP text of its family."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {s.name: Family(family.type, family.documentation)
            for family in text_string_to_metric_families(text) for s in family.samples}


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and template variable."""
    out = [(f"panel {p['title']!r}", t["expr"]) for p in doc["panels"] if p["type"] != "row"
           for t in p["targets"]]
    out += [(f"variable {v['name']!r}", v["query"]["query"])
            for v in doc["templating"]["list"]]
    return out


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Family]]:
    from engines.decoder.config import EngineConfig
    from engines.decoder.runner import Engine
    from engines.router.app import create_app as router_app
    from engines.router.core import Router
    from engines.worker import create_app as worker_app

    root = tmp_path_factory.mktemp("grafana")
    model = make_checkpoint(root / "model", num_key_value_heads=2)
    worker = ThreadServer(worker_app(Engine(model, EngineConfig(block_size=4, num_blocks=64,
                                                                max_batch_tokens=64)))).start()
    router = ThreadServer(router_app(Router([worker.url]))).start()
    try:
        r = httpx.post(f"{router.url}/v1/completions", timeout=60, json={
            "prompt": list(range(10, 30)), "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200, r.text
        with busy_server(root) as (server, traffic):
            traffic.wait_rounds(2)
            yield exported(server.url) | exported(router.url) | exported(worker.url)
    finally:
        router.stop()
        worker.stop()


def test_dashboard_is_a_grafana_document() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["__inputs"][0]["pluginId"] == "prometheus"
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len(panels) >= 20
    for p in panels:
        assert p["targets"] and p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs), p["title"]
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])
    for where, expr in queries(doc):
        for opening, closing in ("()", "{}", "[]"):
            assert expr.count(opening) == expr.count(closing), (where, expr)


def test_every_query_names_an_exported_metric(scraped: dict[str, Family]) -> None:
    doc = json.loads(DASHBOARD.read_text())
    missing, deprecated = [], []
    for where, expr in queries(doc):
        names = METRIC.findall(expr)
        assert names, f"{where}: no kvstore metric in {expr!r}"
        missing += [f"{where}: {name}" for name in names if name not in scraped]
        deprecated += [f"{where}: {name} ({scraped[name].help})" for name in names
                       if name in scraped and scraped[name].help.startswith(DEPRECATED)]
    assert not missing, "\n".join(missing)
    assert not deprecated, "\n".join(deprecated)
    # the families the dashboard is for are there
    for name in ("kvstore_tier_occupancy_ratio", "kvstore_tier_backend_pending_blocks",
                 "kvstore_build_info", "kvstore_received_bytes_total",
                 "kvstore_request_duration_seconds_bucket", "kvstore_worker_running_requests",
                 "process_cpu_seconds_total", "kvstore_connections_open", "kvstore_tier_up",
                 "kvstore_router_decisions_total", "kvstore_router_ttft_seconds_bucket",
                 "kvstore_worker_itl_seconds_bucket", "kvstore_prefetched_total",
                 "kvstore_pinned_bytes"):
        assert name in scraped, name


def test_old_names_are_still_exported_and_marked_deprecated(scraped: dict[str, Family]) -> None:
    """Each renamed series of a server, router and worker is on their pages under both names
    (the cluster's only on a node in a cluster)."""
    for new, old in RENAMED.items():
        if new.startswith("kvstore_cluster_"):
            continue
        suffix = next((s for s in ("_total", "", "_count") if new + s in scraped), None)
        assert suffix is not None, f"{new} is not exported"
        shown = new + ("_total" if suffix == "_total" else "")
        assert scraped[old + suffix].help == DEPRECATED + shown, old
        assert scraped[old + suffix].type == scraped[new + suffix].type, old
        assert not scraped[new + suffix].help.startswith(DEPRECATED), new


def test_exported_names_follow_prometheus_conventions(scraped: dict[str, Family]) -> None:
    """``_total`` on counters only, units in base units, ``_seconds`` last on latency
    histograms (the deprecated names aside)."""
    non_base = re.compile(r"_(ms|milliseconds|minutes|hours|percent|kb|mb|kib|mib|gib)(_|$)")
    for name, family in scraped.items():
        if family.help.startswith(DEPRECATED):
            continue
        assert not non_base.search(name), name
        if family.type == "counter":
            assert name.endswith(("_total", "_created")), name
        else:
            assert not name.endswith("_total"), name
        if family.type == "histogram" and name.endswith("_bucket"):
            assert name.removesuffix("_bucket").endswith(("_seconds", "_bytes")), name
