"""Namespaces over a real server: one validation on both planes, a bad
file entry or registration never breaks the listing, caps per tenant and in total, deletion
on every plane and on the command line, and a private data dir."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore.client import KVStoreClient, UnknownNamespaceError
from kvstore.client.errors import KVStoreClientError
from kvstore.testing.server import ServerProc, kvstore_cmd

ADMIN, TOK_A, TOK_B = "store-admin", "store-tenant-a", "store-tenant-b"
BLOCK = 4096


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(depth - 1):
        doc = {"a": doc}
    return doc


@pytest.fixture(scope="module")
def store_secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """A server with an admin and two tenants, 3 namespaces per tenant at most; started
    under umask 0 over a namespaces file with one bad entry."""
    data = tmp_path_factory.mktemp("sec-ns") / "data"
    data.mkdir()
    good = {"name": "from-file", "block_bytes": BLOCK, "tenant": "a"}
    bad = {"name": "deep", "block_bytes": BLOCK, "layout": {"extra": nested(300)}}
    (data / "namespaces.json").write_text(json.dumps([bad, good]))
    proc = ServerProc(data, "--token", ADMIN, "--max-namespaces-per-tenant", "3",
                      "--max-namespaces", "20",
                      env={"KVSTORE_TENANT_TOKENS": json.dumps({"a": TOK_A, "b": TOK_B})})
    old = os.umask(0)
    try:
        proc.start()
    finally:
        os.umask(old)
    yield proc
    proc.stop()


def register(proc: ServerProc, token: str, name: str, **fields: Any) -> httpx.Response:
    return httpx.post(proc.url + "/v1/namespaces", headers=bearer(token),
                      json={"name": name, "block_bytes": BLOCK, **fields}, timeout=30)


def listing(proc: ServerProc, token: str) -> list[str]:
    r = httpx.get(proc.url + "/v1/namespaces", headers=bearer(token), timeout=30)
    assert r.status_code == 200, r.text
    return [ns["name"] for ns in r.json()["namespaces"]]


def test_bad_file_entry_is_skipped_and_the_rest_served(store_secured: ServerProc) -> None:
    assert listing(store_secured, TOK_A) == ["from-file"]
    assert "deep" not in listing(store_secured, ADMIN)


def test_deep_extra_is_refused_and_listing_keeps_working(store_secured: ServerProc) -> None:
    r = register(store_secured, TOK_B, "deep-b", layout={"extra": nested(300)})
    assert r.status_code == 422 and "nested deeper" in r.json()["message"]
    r = register(store_secured, TOK_B, "big-b", layout={"extra": {"x": "y" * 5000}})
    assert r.status_code == 422 and "4096" in r.json()["message"]
    assert "deep-b" not in listing(store_secured, ADMIN)


@pytest.mark.parametrize("fields", [
    {"tenant": 7},
    {"block_bytes": 1 << 62},
    {"hash_seed": "s" * 100_000},
    {"layout": {"extra": nested(300)}},
    {"layout": {"unknown_field": 1}},
])
def test_data_plane_register_uses_the_same_validation(store_secured: ServerProc,
                                                      fields: dict[str, Any]) -> None:
    args: dict[str, Any] = {"name": "dp-bad", "block_bytes": BLOCK, "layout": {}, **fields}
    with KVStoreClient(store_secured.url, ADMIN, use_shm=False) as client:
        with pytest.raises(KVStoreClientError) as err:
            client.register_namespace(**args)
        assert err.value.code == "invalid_request"
    assert "dp-bad" not in listing(store_secured, ADMIN)


def test_namespaces_are_capped_per_tenant(store_secured: ServerProc) -> None:
    for i in range(2):  # tenant a holds from-file already: 3 in all
        assert register(store_secured, TOK_A, f"cap-a-{i}").status_code == 201
    r = register(store_secured, TOK_A, "cap-a-2")
    assert r.status_code == 507 and r.json()["error"] == "namespace_limit"
    assert register(store_secured, TOK_B, "cap-b-0").status_code == 201  # b is not affected
    r = httpx.delete(store_secured.url + "/v1/namespaces/cap-a-0", headers=bearer(TOK_A))
    assert r.status_code == 200
    assert register(store_secured, TOK_A, "cap-a-2").status_code == 201


def test_delete_namespace_over_rest(store_secured: ServerProc) -> None:
    assert register(store_secured, TOK_B, "del-rest").status_code == 201
    h = os.urandom(16).hex()
    r = httpx.put(f"{store_secured.url}/v1/blocks/del-rest/{h}?durable=true",
                  content=os.urandom(BLOCK), headers=bearer(TOK_B))
    assert r.status_code == 201, r.text
    url = store_secured.url + "/v1/namespaces/del-rest"
    r = httpx.delete(url, headers=bearer(TOK_A))  # another tenant's: unknown, nothing gone
    assert r.status_code == 404
    assert "del-rest" in listing(store_secured, TOK_B)
    r = httpx.delete(url, headers=bearer(TOK_B))
    assert r.status_code == 200 and r.json() == {"name": "del-rest", "blocks": 1}
    assert "b~del-rest" not in listing(store_secured, ADMIN)
    assert httpx.delete(url, headers=bearer(TOK_B)).status_code == 404
    # the name is free again, and the old block is gone from every tier
    assert register(store_secured, TOK_B, "del-rest").status_code == 201
    r = httpx.get(f"{store_secured.url}/v1/blocks/del-rest/{h}", headers=bearer(TOK_B))
    assert r.status_code == 404
    r = httpx.delete(url.replace("del-rest", "b~del-rest"), headers=bearer(ADMIN))
    assert r.status_code == 200  # the admin: any, naming a tenant's as tenant~name


def test_delete_namespace_over_the_data_plane(store_secured: ServerProc) -> None:
    hashes = [os.urandom(16) for _ in range(5)]
    with KVStoreClient(store_secured.url, TOK_A) as a, \
            KVStoreClient(store_secured.url, TOK_B) as b:
        b.register_namespace("del-dp", BLOCK, {})
        b.put("del-dp", hashes, [os.urandom(BLOCK) for _ in hashes])
        with pytest.raises(UnknownNamespaceError):  # another tenant's: unknown to a
            a.delete_namespace("del-dp")
        assert b.delete_namespace("del-dp") == 5
        with pytest.raises(UnknownNamespaceError):
            b.get("del-dp", hashes)
        with pytest.raises(UnknownNamespaceError):
            b.delete_namespace("del-dp")


def kv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvstore_cmd(), *args], capture_output=True, text=True, timeout=120)


def test_namespaces_delete_command(store_secured: ServerProc) -> None:
    assert register(store_secured, TOK_B, "del-cli").status_code == 201
    common = ("--url", store_secured.url, "--token", TOK_B)
    run = kv("namespaces", "list", *common)
    assert run.returncode == 0 and "del-cli" in run.stdout
    run = kv("namespaces", "delete", "del-cli", *common)
    assert run.returncode == 0, run.stderr
    assert "deleted namespace del-cli (0 blocks)" in run.stdout
    run = kv("namespaces", "delete", "del-cli", *common)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "unknown namespace" in run.stderr


def test_data_dir_is_private_whatever_the_umask(store_secured: ServerProc) -> None:
    assert register(store_secured, ADMIN, "perm").status_code in (200, 201)
    data = store_secured.data_dir
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "lmdb").stat().st_mode) == 0o700
    for path in (data / "lmdb" / "data.mdb", data / "lmdb" / "lock.mdb",
                 data / "namespaces.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_served_namespaces_file_is_bounded(store_secured: ServerProc) -> None:
    size = Path(store_secured.data_dir / "namespaces.json").stat().st_size
    assert size < 64 << 10
