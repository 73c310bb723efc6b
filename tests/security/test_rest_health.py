"""``/healthz`` without a token says only whether the server is up: not the tiers' block
counts, free slots or the LMDB file's path. The admin's token gets all of it (``kvstore health``
and the dashboard use it), a tenant's token only whether each tier is ok, a wrong token 401."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from kvstore.testing.proc import ROOT
from kvstore.testing.server import ServerProc, kvstore_cmd

ADMIN = "rest-health-admin"
TENANT = "rest-health-tenant"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("rest-health") / "data", "--token", ADMIN,
                      "--tenant-tokens", json.dumps({"t": TENANT})).start()
    yield proc
    proc.stop()
    assert "Traceback" not in proc.log(200_000)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVSTORE_TOKEN"}
    return {**env, **extra}


def _health(srv: ServerProc, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{srv.url}/healthz", headers=headers, timeout=30)


def test_healthz_without_a_token_says_only_whether_it_is_up(srv: ServerProc) -> None:
    r = _health(srv, None)
    assert r.status_code == 200, r.text
    assert r.json() == {"ok": True}, r.json()
    assert str(srv.data_dir) not in r.text


def test_the_admin_token_gets_every_tier_in_detail(srv: ServerProc) -> None:
    doc = _health(srv, ADMIN).json()
    assert doc["ok"] is True
    assert {"slots", "free_slots", "blocks"} <= set(doc["tiers"]["host"]), doc
    assert doc["tiers"]["disk"]["path"].startswith(str(srv.data_dir)), doc
    run = subprocess.run([*kvstore_cmd(), "health", "--url", srv.url], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, env=_env(KVSTORE_TOKEN=ADMIN))
    assert run.returncode == 0, run.stderr
    assert any(line.startswith("  tier host: ok  slots") for line in run.stdout.splitlines())


def test_a_tenant_token_gets_only_whether_each_tier_is_ok(srv: ServerProc) -> None:
    doc = _health(srv, TENANT).json()
    assert doc == {"ok": True, "tiers": {"host": {"ok": True}, "disk": {"ok": True}}}, doc


def test_a_wrong_token_is_401_and_the_cli_without_one_says_what_it_lacks(
        srv: ServerProc) -> None:
    r = _health(srv, "not-a-token")
    assert r.status_code == 401 and r.json()["error"] == "unauthenticated", r.text
    run = subprocess.run([*kvstore_cmd(), "health", "--url", srv.url], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, env=_env())
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert run.stdout.splitlines() == [
        f"{srv.url}: ok", "  (each tier's health needs a token: --token or KVSTORE_TOKEN)"]
