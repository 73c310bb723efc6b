"""REST control plane against a live ``kvstore serve``: every path with its exact payloads,
status codes and error bodies."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from kvstore.testing.server import ServerProc

BLOCK = 4096


def h(i: int, ns: str = "") -> str:
    return hashlib.sha256(f"{ns}/{i}".encode()).hexdigest()


def block(i: int) -> bytes:
    return (i.to_bytes(4, "little") * (BLOCK // 4))


@pytest.fixture
def api(server: ServerProc) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture
def ns(api: httpx.Client, ns_name: str) -> str:
    r = api.post("/v1/namespaces", json={"name": ns_name, "block_bytes": BLOCK,
                                         "layout": {"model_id": "tiny", "num_layers": 2}})
    assert r.status_code == 201, r.text
    return ns_name


def assert_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code and body["message"], body


def test_register_is_idempotent_and_conflicts_are_409(api: httpx.Client, ns_name: str) -> None:
    doc = {"name": ns_name, "block_bytes": BLOCK, "layout": {"model_id": "m", "dtype": "bf16"},
           "hash_algo": "sha256", "hash_seed": "42"}
    r = api.post("/v1/namespaces", json=doc)
    assert r.status_code == 201
    assert r.json()["block_bytes"] == BLOCK and r.json()["hash_seed"] == "42"
    assert api.post("/v1/namespaces", json=doc).status_code == 200
    for change in ({"block_bytes": BLOCK * 2}, {"hash_seed": "43"}, {"hash_algo": "sha256_cbor"},
                   {"layout": {"model_id": "other"}}):
        r = api.post("/v1/namespaces", json={**doc, **change})
        assert_error(r, 409, "namespace_conflict")
        assert ns_name in r.json()["message"]
    names = [n["name"] for n in api.get("/v1/namespaces").json()["namespaces"]]
    assert ns_name in names


@pytest.mark.parametrize("bad", [
    {"block_bytes": 0}, {"block_bytes": -1}, {"block_bytes": "x"}, {"hash_algo": "md5"},
    {"name": "bad name"}, {"name": ""}, {"layout": {"num_layers": -1}}, {"unknown": 1},
])
def test_register_rejects_bad_bodies_with_422(api: httpx.Client, bad: dict) -> None:
    r = api.post("/v1/namespaces", json={"name": "ok-name", "block_bytes": BLOCK, **bad})
    assert_error(r, 422, "validation")


def test_block_put_get_delete_roundtrip(api: httpx.Client, ns: str) -> None:
    url = f"/v1/blocks/{ns}/{h(1, ns)}"
    r = api.put(url, content=block(1), headers={"content-type": "application/octet-stream"})
    assert r.status_code == 201 and r.json() == {"stored": 1, "existing": 0, "refused": 0}
    r = api.put(url, content=block(1))
    assert r.status_code == 200 and r.json()["existing"] == 1
    r = api.get(url)
    assert r.status_code == 200 and r.content == block(1)
    assert r.headers["content-type"] == "application/octet-stream"
    assert api.delete(url).json() == {"deleted": 1}
    assert_error(api.get(url), 404, "block_not_found")
    assert api.delete(url).json() == {"deleted": 0}


def test_durable_put_is_acknowledged(api: httpx.Client, ns: str) -> None:
    r = api.put(f"/v1/blocks/{ns}/{h(2, ns)}", params={"durable": "true"}, content=block(2))
    assert r.status_code == 201
    r = api.post("/v1/lookup", json={"namespace": ns, "block_hashes": [h(2, ns)]})
    assert r.json() == {"prefix_blocks": 1, "tiers": ["disk"]}


def test_block_errors(api: httpx.Client, ns: str) -> None:
    assert_error(api.put(f"/v1/blocks/{ns}/{h(3)}", content=b"x" * (BLOCK - 1)), 400,
                 "block_size")
    assert_error(api.put(f"/v1/blocks/nope-{ns}/{h(3)}", content=block(3)), 404,
                 "unknown_namespace")
    assert_error(api.get(f"/v1/blocks/nope-{ns}/{h(3)}"), 404, "unknown_namespace")
    for bad in ("xyz", "abc", "00" * 65):
        assert_error(api.put(f"/v1/blocks/{ns}/{bad}", content=block(3)), 422, "validation")
    # nothing partially visible after the refusals
    r = api.post("/v1/lookup", json={"namespace": ns, "block_hashes": [h(3)]})
    assert r.json()["prefix_blocks"] == 0


def test_lookup_gives_longest_prefix_and_tiers(api: httpx.Client, ns: str) -> None:
    for i in (0, 1, 2, 4):
        assert api.put(f"/v1/blocks/{ns}/{h(i, ns)}", content=block(i)).status_code == 201
    r = api.post("/v1/lookup", json={"namespace": ns,
                                     "block_hashes": [h(i, ns) for i in range(6)]})
    assert r.status_code == 200
    assert r.json() == {"prefix_blocks": 3, "tiers": ["host", "host", "host"]}
    assert_error(api.post("/v1/lookup", json={"namespace": ns, "block_hashes": ["zz"]}), 422,
                 "validation")
    assert_error(api.post("/v1/lookup", json={"namespace": "nope-x", "block_hashes": []}), 404,
                 "unknown_namespace")
    assert_error(api.post("/v1/lookup", json={"namespace": ns}), 422, "validation")


def test_prefetch_accepts(api: httpx.Client, ns: str) -> None:
    r = api.post("/v1/prefetch", json={"namespace": ns, "block_hashes": [h(0, ns), h(9, ns)]})
    assert r.status_code == 202 and r.json() == {"accepted": 2}


def test_stats_have_every_counter_per_tier_and_namespace(api: httpx.Client, ns: str) -> None:
    api.put(f"/v1/blocks/{ns}/{h(7, ns)}", content=block(7))
    api.get(f"/v1/blocks/{ns}/{h(7, ns)}")
    api.get(f"/v1/blocks/{ns}/{h(8, ns)}")
    doc = api.get("/v1/stats").json()
    keys = {"queries", "hits", "misses", "hit_rate", "blocks", "bytes", "capacity_bytes",
            "evictions", "promotions", "demotions", "corrupt_dropped"}
    assert keys <= set(doc["totals"])
    assert set(doc["tiers"]) == {"host", "disk"}
    for group in (*doc["tiers"].values(), doc["namespaces"][ns]):
        assert keys <= set(group)
    mine = doc["namespaces"][ns]
    assert mine["hits"] >= 1 and mine["misses"] >= 1 and mine["blocks"] >= 1


def test_metrics_are_labelled_by_tier_and_namespace(api: httpx.Client, ns: str) -> None:
    api.put(f"/v1/blocks/{ns}/{h(5, ns)}", content=block(5))
    text = api.get("/metrics").text
    assert 'kvstore_tier_blocks{tier="host"}' in text
    assert f'kvstore_namespace_hits_total{{namespace="{ns}"}}' in text
    assert "kvstore_requests_total{" in text and "kvstore_hits_total" in text


def test_requests_are_counted_by_route_and_status(api: httpx.Client, ns: str) -> None:
    route = "/v1/blocks/{namespace}/{block_hash_hex}"

    def count(status: int) -> float:
        for line in api.get("/metrics").text.splitlines():
            if line.startswith("kvstore_requests_total{") and f'op="{route}"' in line \
                    and 'plane="rest"' in line and f'status="{status}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = count(201), count(200), count(404)
    assert api.put(f"/v1/blocks/{ns}/{h(7, ns)}", content=block(7)).status_code == 201
    assert api.get(f"/v1/blocks/{ns}/{h(7, ns)}").content == block(7)
    assert api.get(f"/v1/blocks/{ns}/{h(8, ns)}").status_code == 404
    assert (count(201), count(200), count(404)) == tuple(b + 1 for b in before)


def test_healthz_and_info(api: httpx.Client, server: ServerProc) -> None:
    r = api.get("/healthz")
    assert r.status_code == 200 and r.json()["ok"] is True
    assert set(r.json()["tiers"]) == {"host", "disk"}
    info = api.get("/v1/info").json()
    assert info["data_port"] == server.data_port and info["shm"]["size"] > 0
    assert info["unix_socket"].endswith("kvstore.sock") and info["auth_required"] is False


def test_openapi_documents_every_error(api: httpx.Client) -> None:
    doc = api.get("/openapi.json").json()
    assert api.get("/docs").status_code == 200
    paths = doc["paths"]
    for path in ("/v1/namespaces", "/v1/lookup", "/v1/prefetch", "/v1/stats", "/healthz",
                 "/metrics", "/v1/blocks/{namespace}/{block_hash_hex}"):
        assert path in paths
    put = paths["/v1/blocks/{namespace}/{block_hash_hex}"]["put"]["responses"]
    assert {"400", "404", "413", "422", "507"} <= set(put)
    assert "403" not in put  # another tenant's namespace is unknown (404), not forbidden
    assert "401" not in put and "securitySchemes" not in doc.get("components", {})  # no token
    assert "409" in paths["/v1/namespaces"]["post"]["responses"]
    assert "503" in paths["/healthz"]["get"]["responses"]
    ref = put["404"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/ErrorBody")


def test_request_size_limit_gives_413(make_server, ns_name: str) -> None:
    srv = make_server("--max-request-bytes", "8KiB")
    with httpx.Client(base_url=srv.url, timeout=30) as api:
        api.post("/v1/namespaces", json={"name": ns_name, "block_bytes": 16384})
        r = api.put(f"/v1/blocks/{ns_name}/{h(1)}", content=b"x" * 16384)
        assert_error(r, 413, "too_large")
        r = api.post("/v1/lookup", json={"namespace": ns_name, "block_hashes": [h(1)] * 200})
        assert_error(r, 413, "too_large")
        assert api.get("/healthz").status_code == 200
