"""Renamed metrics: every series a server, a worker or the router renamed is exported under its
new name and, for one release, under its old one with the same samples and a HELP text that
says ``deprecated: use <new>``; the new names follow Prometheus' conventions."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from engines.router.metrics import RENAMED as ROUTER_RENAMED
from engines.worker_metrics import RENAMED as WORKER_RENAMED
from kvstore.protocol.cluster import ClusterStatus, IndexView, RedisView
from kvstore.protocol.stats import Counts, StoreStats
from server.cluster_metrics import ClusterCollector
from server.metrics import RENAMED as SERVER_RENAMED
from server.metrics import ServerMetrics, tenant_registry
from server.renamed_metrics import RenamingRegistry
from server.store_metrics import RENAMED as STORE_RENAMED

EVERY_RENAME = SERVER_RENAMED | WORKER_RENAMED | ROUTER_RENAMED
# units that are not Prometheus' base units, as a name's last word
NOT_BASE = re.compile(r"_(ms|milliseconds|minutes|hours|percent|kb|mb|kib|mib|gib)(_total)?$")


def families(text: bytes) -> dict[str, Metric]:
    """The families on a page, by name (not the ``_created`` gauges of counters)."""
    return {f.name: f for f in text_string_to_metric_families(text.decode())
            if not f.name.endswith("_created")}


def samples(family: Metric) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A family's samples with the family name taken off their names (``_bucket``...)."""
    return {(s.name[len(family.name):], tuple(sorted(s.labels.items()))): s.value
            for s in family.samples}


def check_renamed(got: dict[str, Metric], renamed: dict[str, str]) -> None:
    for new, old in renamed.items():
        assert new in got and old in got, (new, old)
        new_name = new + ("_total" if got[new].type == "counter" else "")
        assert got[old].documentation == f"deprecated: use {new_name}", old
        assert got[old].type == got[new].type, old
        assert samples(got[old]) == samples(got[new]), old
        assert not got[new].documentation.startswith("deprecated"), new


def test_a_renamed_family_is_exported_under_both_names() -> None:
    registry = RenamingRegistry({"demo_sent_bytes": "demo_bytes_out",
                                 "demo_request_duration_seconds": "demo_request_seconds",
                                 "demo_pinned_blocks": "demo_pinned"})
    Counter("demo_sent_bytes", "bytes sent", ["plane"], registry=registry).labels("tcp").inc(5)
    Histogram("demo_request_duration_seconds", "latency", registry=registry).observe(0.2)
    Gauge("demo_pinned_blocks", "pinned", registry=registry).set(3)
    Gauge("demo_other", "not renamed", registry=registry).set(1)
    got = families(generate_latest(registry))
    check_renamed(got, registry.renamed)
    assert set(got) == {"demo_sent_bytes", "demo_bytes_out", "demo_request_duration_seconds",
                        "demo_request_seconds", "demo_pinned_blocks", "demo_pinned",
                        "demo_other"}
    text = generate_latest(registry).decode()
    assert "# HELP demo_bytes_out_total deprecated: use demo_sent_bytes_total" in text
    assert 'demo_bytes_out_total{plane="tcp"} 5.0' in text
    assert "demo_request_seconds_bucket{" in text and "demo_request_seconds_count 1.0" in text


def _stats() -> StoreStats:
    row = Counts(queries=10, hits=7, hit_rate=0.7, bytes_in=300, bytes_out=200).model_dump()
    return StoreStats.model_validate({
        "totals": row | {"pinned": 4, "pinned_bytes": 64},
        "tiers": {"host": row | {"occupancy": 0.5, "backend": {"pending": 2}},
                  "s3": row | {"backend": {"pending": 9}}},
        "namespaces": {"chat": row}})


class _Node:
    def status(self) -> ClusterStatus:
        return ClusterStatus(node_id="n0", redis=RedisView(url="redis://r", connected=True,
                                                           degraded=False),
                             index=IndexView(pending=3, published=5), heartbeat_s=1,
                             suspect_after_s=3, gone_after_s=10)


def test_a_server_exports_every_renamed_series_under_both_names() -> None:
    metrics = ServerMetrics(_stats)
    metrics.registry.register(ClusterCollector(_Node()))  # type: ignore[arg-type]
    metrics.observe("data", "get", "ok", 0.01)
    got = families(generate_latest(metrics.registry))
    check_renamed(got, SERVER_RENAMED)
    assert samples(got["kvstore_received_bytes"])[("_total", ())] == 300
    assert samples(got["kvstore_tier_sent_bytes"])[("_total", (("tier", "host"),))] == 200
    assert samples(got["kvstore_pinned_blocks"])[("", ())] == 4
    assert samples(got["kvstore_tier_occupancy_ratio"])[("", (("tier", "host"),))] == 0.5
    assert samples(got["kvstore_namespace_hit_ratio"])[("", (("namespace", "chat"),))] == 0.7
    assert samples(got["kvstore_tier_backend_pending_blocks"])[("", (("tier", "s3"),))] == 9
    assert samples(got["kvstore_cluster_index_pending_placements"])[("", ())] == 3
    assert samples(got["kvstore_request_duration_seconds"])[
        ("_count", (("op", "get"), ("plane", "data")))] == 1


def test_a_tenant_registry_keeps_the_old_store_names_too() -> None:
    got = families(generate_latest(tenant_registry(_stats)))
    check_renamed(got, {k: v for k, v in STORE_RENAMED.items() if k in got})
    assert "kvstore_received_bytes" in got and "kvstore_bytes_in" in got


def test_new_names_follow_the_conventions() -> None:
    assert len(set(EVERY_RENAME.values())) == len(EVERY_RENAME)  # no two share an old name
    for new, old in EVERY_RENAME.items():
        assert new != old and not new.endswith("_total") and not NOT_BASE.search(new), new
        assert new.startswith("kvstore_"), new
    assert EVERY_RENAME["kvstore_received_bytes"] == "kvstore_bytes_in"
    assert EVERY_RENAME["kvstore_request_duration_seconds"] == "kvstore_request_seconds"
    assert EVERY_RENAME["kvstore_pinned_blocks"] == "kvstore_pinned"


def test_the_operations_guide_lists_every_rename() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    table = text[text.index("| deprecated name | new name |"):].split("\n\n")[0]
    for new, old in EVERY_RENAME.items():
        rows = [row for row in table.splitlines() if f"`{old}`" in row or f"`{old}_total`" in row
                or f"`{old}` (" in row]
        assert len(rows) == 1 and f"`{new}" in rows[0].split("|")[2], (old, new)
