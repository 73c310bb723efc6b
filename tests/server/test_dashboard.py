"""``GET /dashboard`` in headless Chromium (Debian's ``chromium``, driven by Playwright) against
a real ``kvstore serve`` with a token, host, disk and S3 tiers, while a real client keeps it
busy: the page asks for the token, then draws every chart from the server's polls, and the
numbers it shows are the server's own (``/v1/stats`` once the traffic stops). A tenant's token
shows the tenant's own namespace and no tiers, as ``/v1/stats`` does."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore.testing.server import ServerProc
from kvstore.testing.traffic import Traffic, busy_server

CHROMIUM = Path("/usr/bin/chromium")
# no network, no sandbox (root in CI), nothing that phones home
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TOKEN = secrets.token_hex(16)
TENANT_TOKEN = secrets.token_hex(16)
CHARTS = {
    "chart-tier-hits": {"host", "disk", "s3"},
    "chart-ns-hits": {"chat", "code", "acme~acme-chat"},  # the admin names a tenant's so
    "chart-occupancy": {"host", "disk", "s3"},
    "chart-evictions": {"host", "disk", "s3"},
    "chart-bytes": {"in", "out"},
    "chart-pinned": {"pinned"},
    "chart-s3-queue": {"pending"},
}


Busy = tuple[ServerProc, Traffic, Traffic]  # the server, the admin's traffic, a tenant's


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Busy]:
    tenants = json.dumps({"acme": TENANT_TOKEN})
    with busy_server(tmp_path_factory.mktemp("dash"), "--tenant-tokens", tenants, token=TOKEN,
                     pause_s=0.1) as (server, traffic):
        tenant = Traffic(server.url, TENANT_TOKEN, namespaces=("acme-chat",), pause_s=0.2)
        tenant.start()
        try:
            traffic.wait_rounds(3)
            tenant.wait_rounds(2)
            yield server, traffic, tenant
        finally:
            tenant.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: `make test` installs Debian's chromium package")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def wait_polls(page: Any, n: int, timeout_s: float = 60.0) -> int:
    """Wait until the page has drawn ``n`` polls (read from the DOM: the page's CSP forbids
    the eval that Playwright's ``wait_for_function`` needs, as it forbids any inline script)."""
    deadline = time.monotonic() + timeout_s
    while (polls := int(page.get_attribute("body", "data-polls") or 0)) < n:
        assert time.monotonic() < deadline, f"{polls} polls in {timeout_s} s"
        time.sleep(0.1)
    return polls


def series(page: Any, chart: str) -> dict[str, dict[str, str]]:
    return {p.get_attribute("data-name"): {k: p.get_attribute(f"data-{k}") or ""
                                           for k in ("points", "last")} | {
                "d": p.get_attribute("d") or ""}
            for p in page.query_selector_all(f"#{chart} path.series")}


def test_dashboard_draws_the_servers_numbers(busy: Busy, browser: Any, tmp_path: Path) -> None:
    server, traffic, tenant = busy
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    page.goto(f"{server.url}/dashboard?interval=400")
    page.wait_for_selector("#auth:not([hidden])")  # the polls got 401: the page asks
    assert page.is_hidden("#board")
    page.fill("#token", TOKEN)
    page.click("#auth button")
    wait_polls(page, 12)  # about 5 s of live traffic
    live = series(page, "chart-bytes")
    assert float(live["in"]["last"]) > 0 and float(live["out"]["last"]) > 0

    traffic.halt()  # the counters hold still (the clients stay: their pins too)
    tenant.halt()
    assert traffic.error is None and tenant.error is None, (traffic.error, tenant.error)
    wait_polls(page, wait_polls(page, 1) + 3)
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    stats = httpx.get(f"{server.url}/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=30).json()

    for chart, names in CHARTS.items():
        drawn = series(page, chart)
        assert set(drawn) == names, chart
        for name, s in drawn.items():
            assert int(s["points"]) >= 8, (chart, name)
            assert s["d"].count("L") >= 7, (chart, name)  # a line through the points
    totals = stats["totals"]
    shown = page.get_attribute("#hit-rate", "data-value")
    assert float(shown) == pytest.approx(totals["hit_rate"])
    assert page.inner_text("#hit-rate") == f"{100 * totals['hit_rate']:.1f}%"
    assert 0.3 < totals["hit_rate"] < 1
    for tier in ("host", "disk", "s3"):
        last = series(page, "chart-occupancy")[tier]["last"]
        assert float(last) == pytest.approx(stats["tiers"][tier]["occupancy"])
    assert float(series(page, "chart-pinned")["pinned"]["last"]) == totals["pinned_bytes"] > 0
    assert float(series(page, "chart-bytes")["in"]["last"]) == 0  # no traffic now
    assert page.inner_text("#s3") == "up"
    rows = page.inner_text("#tiers tbody")
    assert all(t in rows for t in ("host", "disk", "s3"))
    # the only error is the first poll's 401, before the token was given
    assert all("401" in e for e in errors), errors


def test_a_tenant_sees_its_namespace_and_no_tiers(busy: Busy, browser: Any) -> None:
    server, _, tenant = busy
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server.url}/dashboard?interval=300#token={TENANT_TOKEN}")
    deadline = time.monotonic() + 60
    while int(page.get_attribute("body", "data-polls") or 0) < 5:  # traffic between polls
        assert time.monotonic() < deadline
        tenant.round()
        time.sleep(0.1)
    assert "token" not in page.url  # the fragment is taken out of the address
    assert set(series(page, "chart-ns-hits")) == {"acme-chat"}
    assert series(page, "chart-tier-hits") == {}
    assert "no tier rows" in page.text_content("#chart-tier-hits")  # an SVG: no inner_text
    assert page.inner_text("#pinned") == "\u2013"  # the page's "no value"
    assert page.inner_text("#namespaces tbody").split()[0] == "acme-chat"


def test_page_is_public_and_self_contained(busy: Busy) -> None:
    server = busy[0]
    r = httpx.get(f"{server.url}/dashboard", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "http" not in r.text.replace(f"{server.url}", "")  # no external URL at all
    for asset in ("dashboard.js", "dashboard.css", "favicon.svg"):
        assert httpx.get(f"{server.url}/dashboard/{asset}", timeout=30).status_code == 200
    assert httpx.get(f"{server.url}/v1/stats", timeout=30).status_code == 401  # data: token
