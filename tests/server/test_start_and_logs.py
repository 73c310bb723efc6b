"""What a real ``kvstore serve`` says: a start banner that orients (REST, dashboard, metrics,
the data plane, the data dir, each tier with what it found on disk), one line when it stops
(what it held), and with ``--log-format json`` every line it writes as one JSON object,
uvicorn's access log included (``--access-log``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc


def test_the_banner_says_where_everything_is_and_what_the_disk_held(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "d", "--log-level", "info").start()
    with KVStoreClient(srv.url) as c:
        c.register_namespace("ns", 4096, {"model_id": "m", "block_size": 16})
        c.put("ns", [os.urandom(32) for _ in range(3)], [os.urandom(4096)] * 3)
    srv.stop()
    first = srv.log(100_000)
    # the three blocks were in the host tier only: the stop wrote them to disk
    assert first.count("kvstore stopped: store closed and synced, 3 memory-only blocks "
                       "written to disk (held at the stop: host 3, disk 0)") == 1
    srv.start()  # again on the same data dir: the disk tier's blocks are found
    srv.stop()
    log = srv.log(100_000)[len(first):]  # the log file gets each run's output in turn
    for words in (f"serving REST {srv.url}", f"dashboard {srv.url}/dashboard",
                  f"metrics {srv.url}/metrics", f"tcp 127.0.0.1:{srv.data_port}",
                  f"data dir {srv.data_dir}", "host 64.0MiB", "disk 256.0MiB (3 blocks"):
        assert words in log, (words, log)
    assert "Started server process" not in log and "Shutting down" not in log


def test_json_logs_are_one_object_a_line_access_log_included(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "d", "--log-level", "info", "--log-format", "json",
                     "--access-log").start()
    assert httpx.get(f"{srv.url}/v1/info", timeout=10).status_code == 200
    srv.stop()
    lines = [json.loads(line) for line in srv.log(100_000).splitlines() if line.strip()]
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    start = next(line for line in lines if line.get("event") == "serving")
    assert start["rest"] == srv.url and start["tiers"]["host"]["capacity_bytes"] == 64 << 20
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any("GET /v1/info" in line["message"] and "200" in line["message"]
               for line in access)
    assert [line["event"] for line in lines if "event" in line] == ["serving", "stopped"]
    assert lines[-1]["written_blocks"] == 0 and lines[-1]["lost_blocks"] == 0
