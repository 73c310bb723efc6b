"""Bearer tokens and tenants on both planes."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from kvstore.client import (
    AuthenticationError,
    KVStoreClient,
    UnknownNamespaceError,
)
from kvstore.testing.server import ServerProc
from server.settings import load_settings

ADMIN, TOK_A, TOK_B = "admin-secret", "tenant-a-secret", "tenant-b-secret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> ServerProc:
    tenants = json.dumps({"a": TOK_A, "b": TOK_B})
    proc = ServerProc(tmp_path_factory.mktemp("auth") / "data", "--token", ADMIN,
                      env={"KVSTORE_TENANT_TOKENS": tenants}).start()
    yield proc
    proc.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_rest_requires_a_valid_token(secured: ServerProc) -> None:
    with httpx.Client(base_url=secured.url) as api:
        r = api.get("/v1/stats")
        assert r.status_code == 401 and r.json()["error"] == "unauthenticated"
        assert r.headers["www-authenticate"] == "Bearer"
        assert api.get("/v1/stats", headers=bearer("wrong")).status_code == 401
        assert api.get("/v1/info").status_code == 401
        assert api.get("/metrics").status_code == 401
        assert api.get("/v1/stats", headers=bearer(ADMIN)).status_code == 200
        assert api.get("/healthz").status_code == 200  # probes stay public


def test_openapi_documents_the_bearer_scheme(secured: ServerProc) -> None:
    doc = httpx.get(secured.url + "/openapi.json").json()
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
    lookup = doc["paths"]["/v1/lookup"]["post"]
    assert "401" in lookup["responses"] and lookup["security"]


def test_tenants_see_only_their_namespaces(secured: ServerProc) -> None:
    name = "tenant-ns-" + os.urandom(3).hex()
    with httpx.Client(base_url=secured.url) as api:
        r = api.post("/v1/namespaces", json={"name": name, "block_bytes": 16},
                     headers=bearer(TOK_A))
        assert r.status_code == 201 and r.json()["tenant"] == "a"
        h = "ab" * 32
        put = api.put(f"/v1/blocks/{name}/{h}", content=b"x" * 16, headers=bearer(TOK_A))
        assert put.status_code == 201
        r = api.get(f"/v1/blocks/{name}/{h}", headers=bearer(TOK_B))  # a's name: unknown to b
        assert r.status_code == 404 and r.json()["error"] == "unknown_namespace"
        r = api.post("/v1/namespaces", json={"name": name + "x", "block_bytes": 16,
                                             "tenant": "a"}, headers=bearer(TOK_B))
        assert r.status_code == 403
        seen_b = api.get("/v1/namespaces", headers=bearer(TOK_B)).json()["namespaces"]
        assert name not in [n["name"] for n in seen_b]
        assert name not in api.get("/v1/stats", headers=bearer(TOK_B)).json()["namespaces"]
        seen_admin = api.get("/v1/namespaces", headers=bearer(ADMIN)).json()["namespaces"]
        assert {"name": f"a~{name}", "tenant": "a"}.items() <= next(
            n for n in seen_admin if n["tenant"] == "a" and n["name"].endswith(name)).items()


def test_data_plane_requires_token_and_enforces_tenants(secured: ServerProc) -> None:
    with pytest.raises(AuthenticationError):
        KVStoreClient(secured.url).stats()
    with pytest.raises(AuthenticationError):
        KVStoreClient(secured.url, token="wrong").stats()
    name = "dp-tenant-" + os.urandom(3).hex()
    with KVStoreClient(secured.url, token=TOK_A) as a, \
            KVStoreClient(secured.url, token=TOK_B) as b:
        assert a.register_namespace(name, 16, {}).namespace.tenant == "a"
        assert a.put(name, [b"h" * 32], [b"y" * 16]).stored == 1
        with pytest.raises(UnknownNamespaceError):  # a's name is unknown to b
            b.get(name, [b"h" * 32])
        with pytest.raises(UnknownNamespaceError):
            b.put(name, [b"i" * 32], [b"y" * 16])
        with pytest.raises(UnknownNamespaceError):
            b.lookup("no-such-" + name, [b"h" * 32])
        assert a.get(name, [b"h" * 32]) == [b"y" * 16]


def test_non_loopback_bind_requires_a_token() -> None:
    with pytest.raises(ValueError, match="requires a token"):
        load_settings(host="0.0.0.0")
    assert load_settings(host="0.0.0.0", token="t").host == "0.0.0.0"
