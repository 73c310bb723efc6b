"""What tenants can see of each other: a tenant's ``/metrics`` and
``/v1/stats`` cover only its own namespaces (the admin sees all), the server's info names its
data dir to the admin alone, and tokens can come from files so that they stay out of the
process list."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.testing.server import ServerProc
from server.cli import add_serve_parser
from tests.security.dataplane_wire import call, connect

ADMIN, TOK_A, TOK_B = "vis-admin-secret", "vis-tenant-a-secret", "vis-tenant-b-secret"
BLOCK = 64


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _secret_file(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def vis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    root = tmp_path_factory.mktemp("visibility")
    token_file = _secret_file(root / "admin.token", ADMIN + "\n")
    tenants_file = _secret_file(root / "tenants.json", json.dumps({"a": TOK_A, "b": TOK_B}))
    proc = ServerProc(root / "data", "--token-file", token_file,
                      env={"KVSTORE_TENANT_TOKENS_FILE": tenants_file}).start()
    with httpx.Client(base_url=proc.url) as api:
        for tenant, token, blocks in (("a", TOK_A, 2), ("b", TOK_B, 5)):
            name = f"vis-{tenant}"
            r = api.post("/v1/namespaces", json={"name": name, "block_bytes": BLOCK},
                         headers=_bearer(token))
            assert r.status_code == 201, r.text
            for i in range(blocks):
                r = api.put(f"/v1/blocks/{name}/{i:064x}", content=bytes([i]) * BLOCK,
                            headers=_bearer(token))
                assert r.status_code == 201, r.text
            r = api.post("/v1/lookup", json={"namespace": name, "block_hashes": ["00" * 32]},
                         headers=_bearer(token))
            assert r.status_code == 200, r.text
    yield proc
    proc.stop()


def test_tokens_from_files_stay_out_of_the_process_list(vis_server: ServerProc) -> None:
    assert vis_server.proc is not None
    cmdline = Path(f"/proc/{vis_server.proc.pid}/cmdline").read_bytes()
    environ_visible = os.access(f"/proc/{vis_server.proc.pid}/environ", os.R_OK)
    for secret in (ADMIN, TOK_A, TOK_B):
        assert secret.encode() not in cmdline
    assert environ_visible  # same user: a test may read it; other users may not
    with httpx.Client(base_url=vis_server.url) as api:
        for token in (ADMIN, TOK_A, TOK_B):
            assert api.get("/v1/stats", headers=_bearer(token)).status_code == 200
        assert api.get("/v1/stats", headers=_bearer("nope")).status_code == 401


def test_tenant_metrics_list_only_its_namespaces(vis_server: ServerProc) -> None:
    with httpx.Client(base_url=vis_server.url) as api:
        mine = api.get("/metrics", headers=_bearer(TOK_A))
        admin = api.get("/metrics", headers=_bearer(ADMIN))
    assert mine.status_code == 200 and admin.status_code == 200
    assert 'namespace="vis-a"' in mine.text and 'namespace="vis-b"' not in mine.text
    assert 'tier="' not in mine.text  # the shared tiers' counters are everyone's traffic
    assert "kvstore_requests_total" not in mine.text  # every tenant's traffic
    assert "kvstore_blocks 2.0" in mine.text
    # the admin names a tenant's namespace tenant~name
    assert 'namespace="a~vis-a"' in admin.text and 'namespace="b~vis-b"' in admin.text
    assert "kvstore_blocks 7.0" in admin.text and "kvstore_requests_total" in admin.text


def test_tenant_stats_totals_cover_only_its_namespaces(vis_server: ServerProc) -> None:
    with httpx.Client(base_url=vis_server.url) as api:
        mine = api.get("/v1/stats", headers=_bearer(TOK_B)).json()
        admin = api.get("/v1/stats", headers=_bearer(ADMIN)).json()
    assert set(mine["namespaces"]) == {"vis-b"} and mine["tiers"] == {}
    assert mine["totals"]["blocks"] == 5 and mine["totals"]["bytes"] == 5 * BLOCK
    assert mine["totals"]["queries"] == mine["namespaces"]["vis-b"]["queries"]
    assert {"a~vis-a", "b~vis-b"} <= set(admin["namespaces"]) and admin["tiers"]
    assert admin["totals"]["blocks"] == 7


def test_only_the_admin_sees_the_data_dir(vis_server: ServerProc) -> None:
    data_dir = str(vis_server.data_dir.resolve())
    with httpx.Client(base_url=vis_server.url) as api:
        admin = api.get("/v1/info", headers=_bearer(ADMIN)).json()
        mine = api.get("/v1/info", headers=_bearer(TOK_A)).json()
    assert admin["data_dir"] == data_dir and admin["rest_port"] == vis_server.port
    assert mine["data_dir"] is None and mine["rest_port"] == vis_server.port
    for token, shown in ((ADMIN, data_dir), (TOK_A, None)):  # the data plane's hello too
        with connect(vis_server) as s:
            reply = call(s, {"op": "hello", "id": 1, "token": token})
        assert reply["ok"] is True and reply["data_dir"] == shown, reply


def test_token_flags_are_documented_as_visible_in_ps() -> None:
    sub = argparse.ArgumentParser(prog="kvstore").add_subparsers()
    add_serve_parser(sub)
    text = " ".join(sub.choices["serve"].format_help().split())
    for flag in ("--token TOKEN", "--tenant-tokens TENANT_TOKENS"):
        after = text[text.index(flag, text.index("options:")):]
        assert "PROCESS LIST" in after[:300], after[:300]
    assert "--token-file" in text and "--tenant-tokens-file" in text


def test_a_token_given_twice_is_refused(tmp_path: Path) -> None:
    from server.settings import load_settings

    path = _secret_file(tmp_path / "t", "file-token")
    with pytest.raises(ValueError, match="token or token_file"):
        load_settings(data_dir=str(tmp_path), token="flag-token", token_file=path)
    with pytest.raises(ValueError, match="cannot read"):
        load_settings(data_dir=str(tmp_path), token_file=str(tmp_path / "missing"))
    assert load_settings(data_dir=str(tmp_path), token_file=path).token is not None
