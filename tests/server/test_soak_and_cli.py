"""The soak script (a few seconds, 32 clients, zero errors) and the ``kvstore`` commands."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvstore.client import KVStoreClient
from kvstore.testing.proc import ROOT
from kvstore.testing.server import ServerProc, kvstore_cmd


@pytest.mark.slow
def test_soak_runs_clean(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "soak_server.py"), "--seconds",
                          "4", "--clients", "32", "--json", str(out)],
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(out.read_text())
    assert doc["errors"] == 0 and doc["ok"] and sum(doc["ops"].values()) > 0
    assert doc["peak_rss"]["rss"] > 0


def kv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvstore_cmd(), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_stats_and_lookup_commands(server: ServerProc) -> None:
    with KVStoreClient(server.url) as c:
        c.register_namespace("cli", 8, {})
        c.put("cli", [b"\x01" * 32, b"\x02" * 32], [b"a" * 8, b"b" * 8])
    run = kv("stats", "--url", server.url)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "hit_rate" in lines[0] and any(line.startswith("tier host") for line in lines)
    assert any(line.startswith("ns cli") for line in lines)
    run = kv("lookup", "--url", server.url, "cli", "01" * 32, "02" * 32, "03" * 32)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("prefix_blocks 2 of 3")
    run = kv("lookup", "--url", server.url, "--json", "cli", "01" * 32)
    assert json.loads(run.stdout) == {"prefix_blocks": 1, "tiers": ["host"]}
    run = kv("lookup", "--url", server.url, "nope", "01" * 32)
    assert run.returncode != 0 and "unknown_namespace" in run.stderr


def test_serve_rejects_bad_configuration(tmp_path: Path) -> None:
    run = kv("serve", "--data-dir", str(tmp_path), "--host-capacity", "lots")
    assert run.returncode == 2 and "host_capacity" in run.stderr
    run = kv("serve", "--data-dir", str(tmp_path), "--host", "0.0.0.0")
    assert run.returncode == 2 and "requires a token" in run.stderr
    bad = tmp_path / "kv.yaml"
    bad.write_text("port: not-a-port\n")
    run = kv("serve", "--config", str(bad))
    assert run.returncode == 2 and "port" in run.stderr


def test_serve_reads_yaml_and_python_dash_m(tmp_path: Path) -> None:
    """``python -m server --config kv.yaml`` with the ports and sizes from the file, on
    asyncio's own event loop (every other server test runs on the default, uvloop)."""
    srv = ServerProc(tmp_path / "data")
    cfg = tmp_path / "kv.yaml"
    cfg.write_text(f"port: {srv.port}\ndata_port: {srv.data_port}\n"
                   f"data_dir: {tmp_path / 'data'}\nhost_capacity: 32MiB\ndisk_capacity: 64MiB\n"
                   "event_loop: asyncio\n")
    proc = subprocess.Popen([sys.executable, "-m", "server", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    srv.proc = proc
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                r = httpx.get(srv.url + "/v1/stats", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert r.json()["tiers"]["host"]["capacity_bytes"] == 32 << 20
        with KVStoreClient(srv.url) as c:
            assert c.health().ok
    finally:
        assert srv.stop() == 0
