"""Namespace names scoped per tenant, over a real server: two tenants may both have ``chat``,
each sees only its own, and a name of another tenant's is indistinguishable from one nobody
registered (the same 404 and message on REST and the data plane: no existence oracle); the
data plane's ``stats`` gives a tenant REST's view (its namespaces only, no tiers); a restart
keeps both tenants' blocks."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore.client import KVStoreClient
from kvstore.client.errors import KVStoreClientError
from kvstore.testing.server import ServerProc, kvstore_cmd
from kvstore.types import BlockHash

ADMIN, TOK_A, TOK_B = "names-admin", "names-tenant-a", "names-tenant-b"
BLOCK_A, BLOCK_B = 4096, 64  # b's blocks are smaller than a's: a body of a's size is over b's
LAYOUT_A = {"model_id": "model-a", "num_layers": 2, "block_size": 16}
LAYOUT_B = {"model_id": "model-b", "num_layers": 4, "block_size": 16}
HASHES = [BlockHash(os.urandom(32)) for _ in range(4)]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def payload(tenant: str, size: int) -> list[bytes]:
    return [(tenant.encode() + bytes([i])) * (size // 2) for i in range(len(HASHES))]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """Tenant a holds ``chat``, tenant b ``b-only`` (b's ``chat`` comes in :func:`b_chat`)."""
    data = tmp_path_factory.mktemp("tenant-names") / "data"
    proc = ServerProc(data, "--token", ADMIN,
                      env={"KVSTORE_TENANT_TOKENS": json.dumps({"a": TOK_A, "b": TOK_B})})
    proc.start()
    store_chat(proc, TOK_A, "a", BLOCK_A, LAYOUT_A)
    r = httpx.post(proc.url + "/v1/namespaces", headers=bearer(TOK_B), timeout=30,
                   json={"name": "b-only", "block_bytes": BLOCK_B})
    assert r.status_code == 201, r.text
    yield proc
    proc.stop()


def store_chat(proc: ServerProc, token: str, tenant: str, size: int,
               layout: dict[str, Any]) -> None:
    """``tenant`` registers ``chat`` and stores its blocks there durably."""
    r = httpx.post(proc.url + "/v1/namespaces", headers=bearer(token), timeout=30,
                   json={"name": "chat", "block_bytes": size, "layout": layout})
    assert r.status_code in (200, 201), r.text
    assert r.json()["name"] == "chat" and r.json()["tenant"] == tenant
    with KVStoreClient(proc.url, token, use_shm=False) as client:
        got = client.put("chat", HASHES, payload(tenant, size), durable=True)
        assert got.refused == 0, got


def b_chat(proc: ServerProc) -> None:
    """Tenant b registers ``chat`` too (another block size and layout) and stores its own."""
    store_chat(proc, TOK_B, "b", BLOCK_B, LAYOUT_B)


def check_own_blocks(proc: ServerProc) -> None:
    """Each tenant reads its own ``chat`` bytes on both planes."""
    for token, tenant, size in ((TOK_A, "a", BLOCK_A), (TOK_B, "b", BLOCK_B)):
        with KVStoreClient(proc.url, token, use_shm=False) as client:
            assert client.get("chat", HASHES) == payload(tenant, size)
        r = httpx.get(f"{proc.url}/v1/blocks/chat/{HASHES[0].hex()}", headers=bearer(token),
                      timeout=30)
        assert r.status_code == 200 and r.content == payload(tenant, size)[0]


def test_two_tenants_both_have_chat(server: ServerProc) -> None:
    b_chat(server)
    check_own_blocks(server)
    for token, size, layout in ((TOK_A, BLOCK_A, LAYOUT_A), (TOK_B, BLOCK_B, LAYOUT_B)):
        r = httpx.get(server.url + "/v1/namespaces", headers=bearer(token), timeout=30)
        chats = [ns for ns in r.json()["namespaces"] if ns["name"] == "chat"]
        assert len(chats) == 1 and chats[0]["block_bytes"] == size
        assert chats[0]["layout"]["model_id"] == layout["model_id"]
        with KVStoreClient(server.url, token, use_shm=False) as client:
            # re-registering one's own is idempotent, whatever the other tenant holds
            again = client.register_namespace("chat", size, layout)
            assert again.namespace.name == "chat" and not again.created
            # the store's own name (a cluster's index uses it): the tenant's, scoped
            assert again.store_name == f"{again.namespace.tenant}~chat"
    r = httpx.get(server.url + "/v1/namespaces", headers=bearer(TOK_A), timeout=30)
    assert [ns["name"] for ns in r.json()["namespaces"]] == ["chat"]  # not b's b-only
    # the admin sees both, each with its tenant, and names them tenant~name
    r = httpx.get(server.url + "/v1/namespaces", headers=bearer(ADMIN), timeout=30)
    by_name = {ns["name"]: ns["tenant"] for ns in r.json()["namespaces"]}
    assert by_name == {"a~chat": "a", "b~chat": "b", "b~b-only": "b"}
    r = httpx.get(f"{server.url}/v1/blocks/b~chat/{HASHES[1].hex()}", headers=bearer(ADMIN),
                  timeout=30)
    assert r.status_code == 200 and r.content == payload("b", BLOCK_B)[1]


def kv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvstore_cmd(), *args], capture_output=True, text=True, timeout=120)


def test_commands_name_namespaces_as_the_token_does(server: ServerProc) -> None:
    admin, tenant_a = ("--url", server.url, "--token", ADMIN), ("--url", server.url,
                                                               "--token", TOK_A)
    run = kv("namespaces", "list", *admin)
    rows = [line.split() for line in run.stdout.splitlines()]
    assert run.returncode == 0 and ["a~chat", "a", "4.0KiB"] in [r[:3] for r in rows[1:]]
    run = kv("namespaces", "show", "a~chat", *admin)
    assert run.returncode == 0 and run.stdout.split()[:4] == ["name", "a~chat", "tenant", "a"]
    run = kv("stats", *admin)
    assert run.returncode == 0 and "ns a~chat" in run.stdout
    run = kv("namespaces", "list", *tenant_a)
    assert run.returncode == 0 and run.stdout.splitlines()[1].split()[0] == "chat"
    run = kv("stats", *tenant_a)
    assert run.returncode == 0 and "ns chat" in run.stdout and "tier " not in run.stdout
    run = kv("namespaces", "show", "b-only", *tenant_a)  # b's: unknown to a
    assert run.returncode == 2 and "unknown namespace 'b-only'" in run.stderr


def rest_answers(proc: ServerProc, name: str) -> dict[str, tuple[int, Any]]:
    """Every REST route that names a namespace, asked by tenant a about ``name``:
    ``route -> (status, body with the name blanked)``."""
    h = HASHES[0].hex()
    hashes = {"namespace": name, "block_hashes": [h]}
    calls: dict[str, Callable[[httpx.Client], httpx.Response]] = {
        "get block": lambda c: c.get(f"/v1/blocks/{name}/{h}"),
        # a body of a's block size, over b's: must not be refused for b's size
        "put block": lambda c: c.put(f"/v1/blocks/{name}/{h}", content=b"x" * BLOCK_A),
        "delete block": lambda c: c.delete(f"/v1/blocks/{name}/{h}"),
        "show": lambda c: c.get(f"/v1/namespaces/{name}"),
        "delete": lambda c: c.delete(f"/v1/namespaces/{name}"),
        "lookup": lambda c: c.post("/v1/lookup", json=hashes),
        "prefetch": lambda c: c.post("/v1/prefetch", json=hashes),
        "explain": lambda c: c.post("/v1/explain", json={"namespace": name,
                                                         "tokens": list(range(32))}),
    }
    out = {}
    with httpx.Client(base_url=proc.url, headers=bearer(TOK_A), timeout=30) as api:
        for route, call in calls.items():
            r = call(api)
            out[route] = (r.status_code, r.text.replace(name, "NAME"))
    return out


def data_plane_answers(proc: ServerProc, name: str) -> dict[str, tuple[str, str]]:
    """Every data-plane op that names a namespace, sent by tenant a about ``name``:
    ``op -> (error code, message with the name blanked)``."""
    ops: dict[str, Callable[[KVStoreClient], Any]] = {
        "get": lambda c: c.get(name, HASHES[:1]),
        "put": lambda c: c.put(name, HASHES[:1], [b"x" * BLOCK_B]),
        "lookup": lambda c: c.lookup(name, HASHES[:1]),
        "prefetch": lambda c: c.prefetch(name, HASHES[:1]),
        "pin": lambda c: c.pin(name, HASHES[:1]),
        "release": lambda c: c.release(name, HASHES[:1]),
        "delete": lambda c: c.delete(name, HASHES[:1]),
        "delete_namespace": lambda c: c.delete_namespace(name),
    }
    out = {}
    with KVStoreClient(proc.url, TOK_A, use_shm=False) as client:
        for op, call in ops.items():
            with pytest.raises(KVStoreClientError) as err:
                call(client)
            out[op] = (err.value.code, err.value.message.replace(name, "NAME"))
    return out


def test_another_tenants_name_is_unknown_everywhere(server: ServerProc) -> None:
    unknown = rest_answers(server, "nobody-has-this")
    theirs = rest_answers(server, "b-only")
    assert theirs == unknown
    assert {status for status, _ in unknown.values()} == {404}
    dp_unknown = data_plane_answers(server, "nobody-has-this")
    assert data_plane_answers(server, "b-only") == dp_unknown
    assert {code for code, _ in dp_unknown.values()} == {"unknown_namespace"}
    # nor by the admin's name for it; and a's calls left b's namespace in place
    assert rest_answers(server, "b~b-only") == rest_answers(server, "b~nobody-has-this")
    r = httpx.get(server.url + "/v1/namespaces/b-only", headers=bearer(TOK_B), timeout=30)
    assert r.status_code == 200 and r.json()["name"] == "b-only"


def test_data_plane_stats_is_the_tenants_own_view(server: ServerProc) -> None:
    for token, theirs in ((TOK_A, "b-only"), (TOK_B, "a~chat")):
        with KVStoreClient(server.url, token, use_shm=False) as client:
            stats = client.stats()
        rest = httpx.get(server.url + "/v1/stats", headers=bearer(token), timeout=30).json()
        assert stats.doc() == rest  # one view, whichever plane asks
        assert theirs not in stats.namespaces
        assert stats.tiers == {}  # the shared tiers are everyone's traffic
        assert stats.totals.charged_bytes is None and "charged_bytes" not in rest["totals"]
        assert stats.totals.blocks == sum(v.blocks for v in stats.namespaces.values())
    with KVStoreClient(server.url, TOK_A, use_shm=False) as client:
        stats = client.stats()
    assert set(stats.namespaces) == {"chat"} and stats.totals.blocks == len(HASHES)
    with KVStoreClient(server.url, ADMIN, use_shm=False) as client:
        stats = client.stats()
    assert {"a~chat", "b~b-only"} <= set(stats.namespaces) and stats.tiers


def test_data_plane_health_is_the_tenants_own_view(server: ServerProc) -> None:
    """A tenant's data-plane ``health`` says whether the store and each tier are ok, as REST's
    ``/healthz`` does with its token: not the tiers' block counts, free slots or paths."""
    with KVStoreClient(server.url, TOK_A, use_shm=False) as client:
        health = client.health()
    rest = httpx.get(server.url + "/healthz", headers=bearer(TOK_A), timeout=30).json()
    assert health.doc() == rest  # one view, whichever plane asks
    assert health.ok is True and health.tiers
    assert all(t.model_dump() == {"ok": True} for t in health.tiers.values()), health
    with KVStoreClient(server.url, ADMIN, use_shm=False) as client:
        full = client.health().doc()
    assert any(len(t) > 1 for t in full["tiers"].values()), full  # the admin sees the detail


def test_restart_keeps_both_tenants_blocks(server: ServerProc) -> None:
    b_chat(server)
    server.restart()
    check_own_blocks(server)
    r = httpx.get(server.url + "/v1/namespaces", headers=bearer(ADMIN), timeout=30)
    assert {ns["name"] for ns in r.json()["namespaces"]} == {"a~chat", "b~chat", "b~b-only"}


def test_a_name_registered_before_scoping_keeps_its_blocks(tmp_path: Path) -> None:
    """A tenant's namespace in the file from before names were scoped (stored under its plain
    name) stays its tenant's under that name, blocks and all; another tenant may now register
    the same name for itself."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "namespaces.json").write_text(json.dumps(
        [{"name": "legacy", "block_bytes": BLOCK_B, "tenant": "a"}]))
    proc = ServerProc(data, "--token", ADMIN,
                      env={"KVSTORE_TENANT_TOKENS": json.dumps({"a": TOK_A, "b": TOK_B})})
    proc.start()
    try:
        blocks = payload("a", BLOCK_B)
        with KVStoreClient(proc.url, TOK_A, use_shm=False) as a:
            assert a.put("legacy", HASHES, blocks, durable=True).stored == len(HASHES)
        r = httpx.post(proc.url + "/v1/namespaces", headers=bearer(TOK_B), timeout=30,
                       json={"name": "legacy", "block_bytes": BLOCK_A})
        assert r.status_code == 201 and r.json()["name"] == "legacy", r.text
        proc.restart()
        with KVStoreClient(proc.url, TOK_A, use_shm=False) as a, \
                KVStoreClient(proc.url, TOK_B, use_shm=False) as b:
            assert a.register_namespace("legacy", BLOCK_B, {}).store_name == "legacy"
            assert b.register_namespace("legacy", BLOCK_A, {}).store_name == "b~legacy"
            assert a.get("legacy", HASHES) == blocks
            assert b.get("legacy", HASHES) == [None] * len(HASHES)  # b's own, empty
        r = httpx.get(proc.url + "/v1/namespaces", headers=bearer(ADMIN), timeout=30)
        by_name = {ns["name"]: ns["tenant"] for ns in r.json()["namespaces"]}
        assert by_name == {"legacy": "a", "b~legacy": "b"}
    finally:
        proc.stop()


@pytest.mark.parametrize("tenant", ["a~b", "a/b", "", "a b", "x" * 129])
def test_a_tenant_name_that_cannot_be_part_of_a_name_is_refused_at_start(
        tmp_path: Path, tenant: str) -> None:
    """A tenant's name becomes part of its namespaces' names in the store (and so of LMDB
    and S3 keys): it must be a valid name itself, or two tenants' names could meet."""
    from server.settings import load_settings

    with pytest.raises(ValueError, match="tenant name"):
        load_settings(data_dir=str(tmp_path), tenant_tokens={tenant: "secret"})
    assert load_settings(data_dir=str(tmp_path), tenant_tokens={"a.b-1": "secret"})
