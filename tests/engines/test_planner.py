"""``kvstore-planner`` against real workers, router and ``kvstore serve`` on loopback: it moves
a decode worker into the prefill pool when prefill latency is over target and decode has room,
and past its fleet size it prints a scale recommendation (and sets the metric) instead of
moving. Its bad settings, and a router that does not answer at start, are one line and exit
code 2."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from engines.access import bearer
from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.planner.cache import CacheReport
from engines.planner.metrics import PlannerMetrics
from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.store_io import open_store
from engines.testing import ThreadServer
from engines.worker import create_app as worker_app
from kvstore.testing.cli import assert_one_line, port_in_use
from kvstore.testing.proc import console_script, free_port
from kvstore.testing.server import ServerProc

ECFG = EngineConfig(block_size=4, num_blocks=128, max_batch_tokens=64)
TOKEN = "planner-s3cret"
PLANNER = console_script("kvstore-planner", "engines.planner.cli")
# fast judgements so that a test takes seconds: two strikes, a short cooldown
FAST = ("--interval-s", "0.3", "--patience", "2", "--cooldown-s", "1", "--window-s", "6",
        "--min-samples", "2", "--log-ticks")


class Fleet:
    """kvstore, two decode workers and one prefill worker behind a router, with traffic."""

    def __init__(self, model: Path, tmp: Path) -> None:
        self.store = ServerProc(tmp / "kv").start()
        # the workers' token: their admin route (the planner's role switches) needs one
        self.token_file = tmp / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        self.decode = [self._worker(model, "decode") for _ in range(2)]
        self.prefill = [self._worker(model, "prefill")]
        self.router = ThreadServer(router_app(Router(
            [w.url for w in self.decode], prefill_workers=[w.url for w in self.prefill],
            kvstore=self.store.url, worker_token=TOKEN))).start()
        self._stop = threading.Event()
        self._traffic = threading.Thread(target=self._send, daemon=True)
        self._traffic.start()

    def _worker(self, model: Path, role: str) -> ThreadServer:
        return ThreadServer(worker_app(Engine(model, ECFG, open_store(self.store.url)),
                                       role=role, token=TOKEN)).start()

    def _send(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            prompt = [(i * 7 + k) % 90 + 3 for k in range(24)]
            httpx.post(f"{self.router.url}/v1/completions", timeout=60, json={
                "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True})

    def roles(self) -> dict[str, str]:
        return {w.url: httpx.get(f"{w.url}/info", headers=bearer(TOKEN)).json()["role"]
                for w in self.decode + self.prefill}

    def close(self) -> None:
        self._stop.set()
        self._traffic.join(timeout=60)
        for s in (self.router, *self.decode, *self.prefill):
            s.stop()
        self.store.stop()


@pytest.fixture
def fleet(gqa_model: Path, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(gqa_model, tmp_path)
    yield f
    f.close()


def plan(fleet: Fleet, *args: str, until: str, timeout: float = 90) -> list[dict]:
    """Run the planner until it prints an ``until`` event; its JSON lines."""
    proc = subprocess.Popen([*PLANNER, "--router", fleet.router.url, "--token-file",
                             str(fleet.token_file), *FAST, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict] = []
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(json.loads(line))
            if lines[-1]["event"] == until:
                break
    finally:
        timer.cancel()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert lines and lines[-1]["event"] == until, f"no {until}: {lines[-5:]} {err}"
    return lines


def test_moves_a_decoder_to_prefill_when_prefill_is_over_target(fleet: Fleet) -> None:
    # any prefill is over a 0.1 ms TTFT target; decode is far under a 10 s ITL target
    lines = plan(fleet, "--ttft-target-s", "0.0001", "--itl-target-s", "10", until="move")
    move = lines[-1]
    assert move["pool"] == "prefill" and move["from_pool"] == "decode"
    assert move["current"] == {"prefill": 1, "decode": 2}
    assert move["desired"] == {"prefill": 2, "decode": 1}
    assert move["worker"] in [w.url for w in fleet.decode]
    ticks = [x for x in lines if x["event"] == "tick"]
    assert ticks[-1]["prefill"]["pressure"] > 1 and ticks[-1]["decode"]["pressure"] < 0.7
    assert fleet.roles()[move["worker"]] == "prefill"
    deadline = time.monotonic() + 30  # the router learns it and routes prefills there
    while httpx.get(f"{fleet.router.url}/stats").json()["workers"][move["worker"]][
            "role"] != "prefill":
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_past_the_fleet_size_it_recommends_instead(fleet: Fleet) -> None:
    port = free_port()
    lines = plan(fleet, "--ttft-target-s", "0.0001", "--itl-target-s", "10",
                 "--fleet-size", "2", "--metrics-port", str(port), until="recommend")
    rec = lines[-1]
    assert rec["pool"] == "prefill" and rec["fleet"] == 3
    assert rec["desired"] == {"prefill": 2, "decode": 1}
    assert "fleet_size 2" in rec["reason"]
    assert not any(x["event"] == "move" for x in lines)
    assert sorted(fleet.roles().values()) == ["decode", "decode", "prefill"]


def test_both_pools_over_target_recommend_scaling_up(fleet: Fleet) -> None:
    port = free_port()
    proc = subprocess.Popen([*PLANNER, "--router", fleet.router.url, "--token-file",
                             str(fleet.token_file), *FAST, "--ttft-target-s",
                             "0.0001", "--itl-target-s", "0.00001", "--metrics-port",
                             str(port), "--duration-s", "60"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            rec = json.loads(line)
            if rec["event"] == "recommend":
                break
        assert rec["event"] == "recommend" and rec["from_pool"] is None
        assert rec["recommended_fleet"] == 4
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        pool = rec["pool"]
        assert f'kvstore_planner_recommended_workers{{pool="{pool}"}} ' \
               f'{rec["desired"][pool]}.0' in metrics
        assert 'kvstore_planner_pool_workers{pool="prefill"} 1.0' in metrics
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert sorted(fleet.roles().values()) == ["decode", "decode", "prefill"]


def test_it_reports_what_more_cache_would_save_beside_the_split(fleet: Fleet) -> None:
    deadline = time.monotonic() + 60  # the prefill worker has measured its rate
    while httpx.get(f"{fleet.router.url}/stats").json()["workers"][fleet.prefill[0].url][
            "rates"]["prefill_tokens_per_s"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    lines = plan(fleet, "--kvstore", fleet.store.url.removeprefix("http://"),
                 "--cache-report-s", "3", "--dry-run", until="cache")
    report = lines[-1]
    assert report["pools"] == {"prefill": 1, "decode": 2}
    rate = report["prefill_tokens_per_s"]
    assert rate is not None and rate > 0  # measured by the prefill worker
    stats = httpx.get(f"{fleet.store.url}/v1/stats").json()["tiers"]
    assert set(report["tiers"]) == set(stats) == {"host", "disk"}
    for tier, row in report["tiers"].items():
        assert row["capacity_bytes"] == stats[tier]["capacity_bytes"]
        step = row["next_step"]
        assert step["capacity_bytes"] == 2 * row["capacity_bytes"]
        assert step["prefill_s_per_hour"] == pytest.approx(step["tokens_per_hour"] / rate)
    assert report["tiers"]["host"]["requests_per_hour"] > 0  # the fleet's traffic
    metrics = PlannerMetrics()  # what the running planner's /metrics had
    metrics.cached(CacheReport.model_validate(report))
    saved = metrics.registry.get_sample_value(
        "kvstore_planner_cache_saved_prefill_seconds_per_hour", {"tier": "host"})
    assert saved == report["tiers"]["host"]["next_step"]["prefill_s_per_hour"]


@pytest.mark.parametrize("args, says", [
    (["--router", "ftp://localhost:8490"], "--router: 'ftp://localhost:8490' is not an http://"),
    (["--router", "http://x", "--relax", "1.5"], "--relax: Input should be less than 1"),
    (["--router", "http://x", "--patience", "soon"], "--patience: Input should be a valid"),
    (["--router", "http://x", "--token-file", "/nonexistent/t"],
     "--token-file: cannot read"),
])
def test_bad_settings_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    out = subprocess.run([*PLANNER, *args], capture_output=True, text=True, timeout=60)
    assert_one_line(out, says)
    assert out.stdout == ""


def test_a_router_that_does_not_answer_at_start_is_one_line() -> None:
    """Not a retry loop that exits 0 when interrupted: a planner pointed at nothing stops
    at once, as every other command does; one pointed at something else says so."""
    url = f"127.0.0.1:{free_port()}"  # nothing listens there; http:// left out
    out = subprocess.run([*PLANNER, "--router", url], capture_output=True, text=True,
                         timeout=60)
    assert_one_line(out, f"--router http://{url}: cannot reach the router",
                    "start kvstore-router there")
    with ThreadingHTTPServer(("127.0.0.1", 0), NotFound) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        try:
            out = subprocess.run([*PLANNER, "--router", f"127.0.0.1:{web.server_address[1]}"],
                                 capture_output=True, text=True, timeout=60)
        finally:
            web.shutdown()
    assert_one_line(out, "GET /stats answered 404 Not Found", "is --router a kvstore-router?")


class NotFound(BaseHTTPRequestHandler):
    """A web server that is no router: 404 for everything."""

    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


def test_a_taken_metrics_port_is_one_line() -> None:
    with port_in_use() as port:
        out = subprocess.run([*PLANNER, "--router", "http://x", "--metrics-port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert_one_line(out, f"--metrics-port {port}")
