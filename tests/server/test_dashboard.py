"""``GET /dashboard`` in headless Chromium (Debian's ``chromium``, driven by Playwright) against
a real ``kvstore serve`` with a token, host, disk and S3 tiers, while a real client keeps it
busy: the page asks for the token, then draws every chart from the server's polls, and the
numbers it shows are the server's own (``/v1/stats`` once the traffic stops). A tenant's token
shows the tenant's own namespace and no tiers, as ``/v1/stats`` does. The page also holds at
400 px wide, with every legend key in view, and draws sane axes on a server with no traffic."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore import __version__
from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc
from kvstore.testing.traffic import BLOCK, Traffic, busy_server
from kvstore.types import BlockHash

CHROMIUM = Path("/usr/bin/chromium")
# no network, no sandbox (root in CI), nothing that phones home
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TOKEN = secrets.token_hex(16)
TENANT_TOKEN = secrets.token_hex(16)
# namespaces no block is ever asked of: one holding a block, one empty (long names, so that
# the legend of five namespaces needs more than one line)
IDLE = ("idle-namespace-holding-one-block", "idle-namespace-never-used")
ACTIVE_NS = {"chat", "code", "acme~acme-chat"}  # the admin names a tenant's so
CHARTS = {
    "chart-tier-hits": {"host", "disk", "s3"},
    "chart-ns-hits": ACTIVE_NS | set(IDLE),
    "chart-occupancy": {"host", "disk", "s3"},
    "chart-evictions": {"host", "disk", "s3"},
    "chart-bytes": {"in", "out"},
    "chart-pinned": {"pinned"},
    "chart-s3-queue": {"pending"},
    "chart-whatif": {"host", "disk", "s3"},
}


Busy = tuple[ServerProc, Traffic, Traffic]  # the server, the admin's traffic, a tenant's


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Busy]:
    tenants = json.dumps({"acme": TENANT_TOKEN})
    with busy_server(tmp_path_factory.mktemp("dash"), "--tenant-tokens", tenants, token=TOKEN,
                     pause_s=0.1) as (server, traffic):
        with KVStoreClient(server.url, TOKEN, transport="tcp") as admin:
            for ns in IDLE:
                admin.register_namespace(ns, BLOCK, {"model_id": ns})
            admin.put(IDLE[0], [BlockHash(bytes(32))], [bytes(BLOCK)])
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


def open_page(browser: Any, width: int) -> tuple[Any, list[str]]:
    """A page ``width`` px wide and the list its errors (script and console) go to."""
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return page, errors


# Read in one evaluation each: the page redraws its charts and legends at every poll, and an
# element read across two calls may have been replaced in between.
def legend(page: Any, chart: str) -> dict[str, str]:
    """The legend under ``chart``: each key's value, by series name."""
    return dict(page.evaluate(
        """(chart) => [...document.querySelectorAll(`.legend[data-for="${chart}"] .key`)]
               .map((k) => [k.dataset.name, k.querySelector("b").textContent])""", chart))


def y_labels(page: Any, chart: str) -> list[str]:
    return list(page.evaluate(
        """(chart) => [...document.querySelectorAll(`#${chart} text.tick.y`)]
               .map((t) => t.textContent)""", chart))


LAYOUT = """(width) => {
  const bad = [];
  const scroll = document.documentElement.scrollWidth;
  if (scroll > width) bad.push(`the page is ${scroll} px wide`);
  for (const figure of document.querySelectorAll("figure")) {
    const f = figure.getBoundingClientRect();
    if (f.left < 0 || f.right > width) bad.push(`${figure.textContent} spans ${f.left}-${f.right}`);
    for (const key of figure.querySelectorAll(".legend .key")) {
      const k = key.getBoundingClientRect();
      if (!(k.width > 0 && k.left >= f.left && k.right <= f.right && k.top >= f.top
            && k.bottom <= f.bottom)) bad.push(`legend key ${key.textContent} is cut`);
    }
  }
  return bad;
}"""


def check_layout(page: Any, width: int) -> None:
    """Nothing is wider than the page, and every legend key lies inside its chart's box."""
    assert page.evaluate(LAYOUT, width) == []


def check_axes(page: Any) -> None:
    """Every drawn y-axis reads 0 at the bottom, then distinct values (0 alone: all zero)."""
    for chart in CHARTS:
        labels = y_labels(page, chart)
        if labels:
            assert len(set(labels)) == len(labels), (chart, labels)
            assert labels[0].startswith("0"), (chart, labels)


def test_dashboard_draws_the_servers_numbers(busy: Busy, browser: Any, tmp_path: Path) -> None:
    server, traffic, tenant = busy
    page, errors = open_page(browser, 1400)

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
        assert set(legend(page, chart)) == names, chart
        for name, s in drawn.items():
            if name in IDLE:
                assert s["points"] == "0", name
                continue
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
    # the what-if curves: 17 capacities each, today's marked, the key reads today -> 2x
    curves = {p.get_attribute("data-name"): p for p in
              page.query_selector_all("#chart-whatif path.series")}
    for tier in ("host", "disk", "s3"):
        assert curves[tier].get_attribute("data-points") == "17"
        assert curves[tier].get_attribute("d").count("L") == 16
        assert int(curves[tier].get_attribute("data-today")) == stats["tiers"][tier][
            "capacity_bytes"]
    assert page.query_selector("#chart-whatif line.today") is not None
    assert all(" at 2\u00d7" in v for v in legend(page, "chart-whatif").values())
    rows = page.inner_text("#tiers tbody")
    assert all(t in rows for t in ("host", "disk", "s3"))
    # a namespace nothing was asked of has no hit rate: a dash, in the legend and the table
    keys = legend(page, "chart-ns-hits")
    assert [keys[ns] for ns in IDLE] == ["\u2013", "\u2013"]
    assert all(keys[ns].endswith("%") for ns in ACTIVE_NS)
    cells = [[c.inner_text() for c in r.query_selector_all("td")]
             for r in page.query_selector_all("#namespaces tbody tr")]
    table = {row[0]: row for row in cells}
    assert [table[ns][3] for ns in IDLE] == ["\u2013", "\u2013"]
    assert table[IDLE[0]][1] == "1"  # it holds its block all the same
    check_layout(page, 1400)  # five namespaces: the legend wraps, every key in view
    check_axes(page)
    # what "stored bytes" and a tier's bytes are, said on the page
    assert "once" in page.get_attribute("#bytes-card", "title")
    note = page.inner_text("#bytes-note")
    assert "capacity" in note and "Stored bytes" in note
    # the server's version, ports and data dir (the admin's token sees the data dir)
    assert page.inner_text("#version") == __version__
    assert page.inner_text("#rest-port") == str(server.port)
    assert page.inner_text("#data-port") == str(server.data_port)
    assert page.inner_text("#data-dir") == str(server.data_dir.resolve())
    assert page.inner_text("#unix-socket").endswith("kvstore.sock")
    # the only error is the first poll's 401, before the token was given
    assert all("401" in e for e in errors), errors


def test_a_tenant_sees_its_namespace_and_no_tiers(busy: Busy, browser: Any) -> None:
    server, _, tenant = busy
    page, errors = open_page(browser, 1400)
    page.goto(f"{server.url}/dashboard?interval=300#token={TENANT_TOKEN}")
    deadline = time.monotonic() + 60
    while int(page.get_attribute("body", "data-polls") or 0) < 5:  # traffic between polls
        assert time.monotonic() < deadline
        tenant.round()
        time.sleep(0.1)
    assert "token" not in page.url  # the fragment is taken out of the address
    assert set(series(page, "chart-ns-hits")) == {"acme-chat"}
    assert series(page, "chart-tier-hits") == {}
    assert set(series(page, "chart-whatif")) == {"host"}  # its own curve in the top tier
    assert "no tier rows" in page.text_content("#chart-tier-hits")  # an SVG: no inner_text
    assert page.inner_text("#pinned") == "\u2013"  # the page's "no value"
    assert page.inner_text("#namespaces tbody").split()[0] == "acme-chat"
    assert page.inner_text("#version") == __version__
    assert page.inner_text("#data-dir") == "\u2013"  # the operator's path: not a tenant's
    assert errors == []


@pytest.mark.parametrize("width", [400, 420])
def test_a_narrow_page_fits_its_width(busy: Busy, browser: Any, width: int) -> None:
    server = busy[0]
    page, errors = open_page(browser, width)
    page.goto(f"{server.url}/dashboard?interval=300#token={TOKEN}")
    wait_polls(page, 4)
    check_layout(page, width)
    check_axes(page)
    assert set(legend(page, "chart-ns-hits")) == CHARTS["chart-ns-hits"]
    assert page.is_visible("#data-dir")
    assert errors == []


def test_a_server_with_no_traffic_draws_sane_axes(browser: Any, tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "data").start()  # no token: every caller is the admin
    try:
        page, errors = open_page(browser, 400)
        page.goto(f"{server.url}/dashboard?interval=250")
        wait_polls(page, 4)
        check_layout(page, 400)
        check_axes(page)
        for chart in ("chart-bytes", "chart-pinned", "chart-evictions"):
            assert y_labels(page, chart) == [y_labels(page, chart)[0]], chart  # 0 alone
        assert y_labels(page, "chart-bytes") == ["0 B"]
        assert y_labels(page, "chart-occupancy") == ["0%", "25%", "50%", "75%", "100%"]
        assert "no namespace" in page.text_content("#chart-ns-hits")
        assert page.inner_text("#hit-rate") == "\u2013"  # nothing asked for yet
        assert page.inner_text("#data-dir") == str(server.data_dir.resolve())
        assert page.inner_text("#data-port") == str(server.data_port)
        assert errors == []
    finally:
        server.stop()


def test_page_is_public_and_self_contained(busy: Busy) -> None:
    server = busy[0]
    r = httpx.get(f"{server.url}/dashboard", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "http" not in r.text.replace(f"{server.url}", "")  # no external URL at all
    for asset in ("dashboard.js", "dashboard.css", "favicon.svg"):
        assert httpx.get(f"{server.url}/dashboard/{asset}", timeout=30).status_code == 200
    assert httpx.get(f"{server.url}/v1/stats", timeout=30).status_code == 401  # data: token
