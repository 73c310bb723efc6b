"""``/metrics`` of a real ``kvstore serve`` with host, disk and S3 (SeaweedFS) tiers while a
real client keeps it busy: every stats field has its series and the values are the server's
own (``/v1/stats``), plus build info, the process collector, open connections by plane and
whether each tier is up. A renamed series is there under its old name too, marked deprecated."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc
from kvstore.testing.traffic import Traffic, busy_server
from server.metrics import RENAMED

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, Traffic]]:
    with busy_server(tmp_path_factory.mktemp("busy")) as (server, traffic):
        traffic.wait_rounds(25)  # enough to fill host and disk: demotions reach S3
        yield server, traffic


def test_every_stats_field_is_exported(busy: tuple[ServerProc, Traffic]) -> None:
    server, traffic = busy
    traffic.halt()  # hold the counters still while stats and metrics are compared
    stats = httpx.get(f"{server.url}/v1/stats").json()
    got = scrape(server.url)
    for key in ("hits", "misses", "evictions", "demotions", "prefetched", "dropped", "stored"):
        assert got[(f"kvstore_{key}_total", ())] == stats["totals"][key], key
    assert got[("kvstore_received_bytes_total", ())] == stats["totals"]["bytes_in"]
    assert got[("kvstore_sent_bytes_total", ())] == stats["totals"]["bytes_out"]
    assert got[("kvstore_hit_ratio", ())] == pytest.approx(stats["totals"]["hit_rate"])
    assert got[("kvstore_pinned_blocks", ())] == stats["totals"]["pinned"]
    for key in ("pinned_bytes", "charged_bytes"):
        assert got[(f"kvstore_{key}", ())] == stats["totals"][key], key
    assert stats["totals"]["pinned_bytes"] > 0 and stats["totals"]["bytes_out"] > 0
    for tier in ("host", "disk", "s3"):
        row = stats["tiers"][tier]
        label = (("tier", tier),)
        assert got[("kvstore_tier_occupancy_ratio", label)] == pytest.approx(row["occupancy"])
        assert got[("kvstore_tier_evictions_total", label)] == row["evictions"]
        assert got[("kvstore_tier_up", label)] == 1
    assert stats["tiers"]["host"]["occupancy"] > 0.5
    backend = stats["tiers"]["s3"]["backend"]
    s3 = (("tier", "s3"),)
    assert got[("kvstore_tier_backend_pending_blocks", s3)] == backend["pending"]
    assert got[("kvstore_tier_backend_uploaded_total", s3)] > 0
    assert got[("kvstore_tier_backend_degraded", s3)] == 0
    for ns in ("chat", "code"):
        row = stats["namespaces"][ns]
        assert got[("kvstore_namespace_hits_total", (("namespace", ns),))] == row["hits"]
    assert got[("kvstore_up", ())] == 1


def test_renamed_series_keep_their_old_names_for_one_release(
        busy: tuple[ServerProc, Traffic]) -> None:
    server, _ = busy
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for new, old in RENAMED.items():
        if new.startswith("kvstore_cluster_"):
            continue  # a node alone has no cluster series
        assert new in families and old in families, (new, old)
        shown = new + ("_total" if families[new].type == "counter" else "")
        assert families[old].documentation == f"deprecated: use {shown}", old
        assert families[old].type == families[new].type
    assert "# HELP kvstore_bytes_in_total deprecated: use kvstore_received_bytes_total" in text
    assert "# HELP kvstore_request_seconds deprecated: use kvstore_request_duration_seconds" \
        in text
    assert "# HELP kvstore_pinned deprecated: use kvstore_pinned_blocks" in text


def test_build_info_process_and_connections(busy: tuple[ServerProc, Traffic]) -> None:
    server, _ = busy
    with KVStoreClient(server.url, transport="tcp") as tcp, \
            KVStoreClient(server.url, transport="unix") as unix:
        tcp.stats(), unix.stats()  # each opens its data plane connection
        got = scrape(server.url)
        assert got[("kvstore_connections_open", (("plane", "tcp"),))] >= 1
        assert got[("kvstore_connections_open", (("plane", "unix"),))] >= 1
        assert got[("kvstore_connections_open", (("plane", "rest"),))] >= 1  # this scrape
    build = [labels for name, labels in got if name == "kvstore_build_info"]
    assert len(build) == 1 and dict(build[0])["version"]
    assert got[("process_resident_memory_bytes", ())] > 10 << 20
    assert got[("process_cpu_seconds_total", ())] > 0
    assert got[("kvstore_dataplane_connections_total", ())] >= 2
