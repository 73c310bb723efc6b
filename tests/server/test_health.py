"""``/healthz`` answers 503 when the store cannot serve: a tier whose back end is gone, or a
server shutting down. In process, over a real store (no server process needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kvstore.store import Store
from server.metrics import ServerMetrics
from server.rest.app import create_app
from server.runtime import build_info
from server.settings import load_settings


@pytest.fixture
def app_and_store(tmp_path: Path) -> Iterator[tuple[TestClient, Store]]:
    settings = load_settings(data_dir=str(tmp_path), host_capacity="8MiB",
                             disk_capacity="64MiB", shm_name=f"kvs-health-{tmp_path.name}")
    store = Store(settings.store_config())
    app = create_app(store, settings, build_info(settings, store), ServerMetrics(store.stats),
                     "disk")
    try:
        yield TestClient(app), store
    finally:
        store.close()


def test_healthy_store_is_200(app_and_store) -> None:
    client, _ = app_and_store
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["ok"] is True


def test_broken_tier_is_503(app_and_store) -> None:
    client, store = app_and_store
    store.tier("disk").close()  # the LMDB environment is gone
    r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["ok"] is False and r.json()["tiers"]["disk"]["ok"] is False


def test_shutting_down_is_503(app_and_store) -> None:
    client, _ = app_and_store
    client.app.state.closing = True
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json()["closing"] is True


def test_health_answers_as_healthz_and_the_root_sends_a_browser_to_the_dashboard(
        app_and_store) -> None:
    client, store = app_and_store
    assert client.get("/health").json() == client.get("/healthz").json()
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/dashboard"
    assert client.get("/").headers["content-type"].startswith("text/html")
    store.tier("disk").close()
    assert client.get("/health").status_code == 503
