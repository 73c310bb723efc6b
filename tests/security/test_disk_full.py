"""A full disk, on a real small tmpfs: one clear error naming the full
disk (logged once, not once per block), a durable put refused with that reason, health
degraded, and an honest count of the blocks a shutdown could not write.

Mounting needs root (CI runs as root); elsewhere these tests skip."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Namespace
from kvstore.store import Store
from kvstore.testing.server import ServerProc

BLOCK = 64 << 10


def mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                          str(where)], capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")


@pytest.fixture
def store_small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB file system, unmounted at the end."""
    where = tmp_path / "small"
    mount_tmpfs(where, "4m")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)


def store_on(folder: Path, host_blocks: int = 8) -> Store:
    tiers = (TierConfig("host", host_blocks * BLOCK, options={"slot_bytes": BLOCK}),
             TierConfig("disk", 64 << 20, options={"path": str(folder / "lmdb")}))
    store = Store(StoreConfig(tiers, namespaces_path=str(folder / "ns.json")))
    store.register_namespace(Namespace("full", BLOCK))
    return store


def test_full_disk_is_one_clear_error_and_degrades_health(
        store_small_fs: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = store_on(store_small_fs)
    try:
        refused = 0
        with caplog.at_level(logging.DEBUG, logger="kvstore"):
            for _ in range(40):  # 40 x 4 blocks of 64 KiB: far past 4 MiB
                hashes = [os.urandom(16) for _ in range(4)]
                result = store.put("full", hashes, [os.urandom(BLOCK) for _ in hashes],
                                   tier="disk")
                refused += result.refused
        assert refused > 0
        disk = store.health().doc()["tiers"]["disk"]  # the disk tier's own report
        assert disk["ok"] is False and disk["disk_full"] is True
        assert "disk full" in disk["error"]
        assert store.health().ok is False
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(loud) <= 2, [r.getMessage() for r in loud]
        assert "disk" in loud[0].getMessage()
        store.check_integrity()
    finally:
        store.close()


def test_shutdown_counts_the_blocks_it_could_not_write(
        store_small_fs: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = store_on(store_small_fs, host_blocks=128)  # 8 MiB of RAM over a 4 MiB disk
    hashes = [os.urandom(16) for _ in range(100)]
    store.put("full", hashes, [os.urandom(BLOCK) for _ in hashes])
    with caplog.at_level(logging.ERROR, logger="kvstore"):
        lost = store.close()
    assert 0 < lost < 100
    assert any(f"{lost} memory-only blocks" in r.getMessage() for r in caplog.records)
    assert store.close() == 0  # idempotent


@pytest.fixture
def store_full_server(tmp_path: Path) -> Iterator[ServerProc]:
    data = tmp_path / "data"
    mount_tmpfs(data, "4m")
    proc = ServerProc(data, host_capacity="16MiB", disk_capacity="64MiB").start()
    yield proc
    proc.stop()
    subprocess.run(["umount", "-l", str(data)], check=False, timeout=30)


def test_server_on_a_full_disk(store_full_server: ServerProc) -> None:
    url = store_full_server.url
    assert httpx.post(url + "/v1/namespaces", json={"name": "full", "block_bytes": BLOCK}
                      ).status_code == 201
    status, body = 0, {}
    for _ in range(100):  # 100 durable blocks of 64 KiB: past 4 MiB
        r = httpx.put(f"{url}/v1/blocks/full/{os.urandom(16).hex()}?durable=true",
                      content=os.urandom(BLOCK), timeout=30)
        if r.status_code >= 400:
            status, body = r.status_code, r.json()
            break
    assert status == 507 and body["error"] == "disk_full", body
    assert "disk full" in body["message"]
    r = httpx.get(url + "/healthz", timeout=30)
    assert r.status_code == 503
    assert "disk full" in r.json()["tiers"]["disk"]["error"]
    for _ in range(100):  # memory-only blocks, which the shutdown cannot spill
        r = httpx.put(f"{url}/v1/blocks/full/{os.urandom(16).hex()}",
                      content=os.urandom(BLOCK), timeout=30)
        assert r.status_code == 201, r.text
    store_full_server.stop()
    log = store_full_server.log_path.read_text()
    assert "store closed and synced" not in log
    assert "could not be written to disk and are lost" in log
    errors = [line for line in log.splitlines() if "Input/output error" in line
              or "No space left" in line]
    assert len(errors) <= 3, errors
