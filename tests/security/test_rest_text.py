"""A lone surrogate (``"\\ud800"``: valid JSON, not Unicode) in any text field of a REST body is
a 400 naming the field, never a 500 with a traceback (the error that quoted it failed to
encode)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from kvstore.testing.server import ServerProc

TOKEN = "rest-text-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
LONE = '"a\\ud800b"'  # as the JSON text has it
TOKENS = ", ".join(str(i) for i in range(40))
CASES = [
    ("/v1/namespaces", '{"name": %s, "block_bytes": 4096}', "body.name"),
    ("/v1/namespaces", '{"name": "t1", "block_bytes": 4096, "layout": {"model_id": %s}}',
     "body.layout.model_id"),
    ("/v1/namespaces", '{"name": "t2", "block_bytes": 4096, "hash_seed": %s}', "body.hash_seed"),
    ("/v1/namespaces", '{"name": "t3", "block_bytes": 4096, %s: 1}', "body"),
    ("/v1/lookup", '{"namespace": "text", "block_hashes": [%s]}', "body.block_hashes.0"),
    ("/v1/explain", '{"namespace": "text", "tokens": [' + TOKENS + '], "cache_salt": %s}',
     "body.cache_salt"),
    ("/v1/explain", '{"namespace": "text", "tokens": [' + TOKENS + '], "lora_name": %s, '
     '"lora_path": "p"}', "body.lora_name"),
    ("/v1/explain", '{"namespace": "text", "tokens": [1], "mm_hashes": [{"identifier": %s, '
     '"offset": 0, "length": 1}]}', "body.mm_hashes.0.identifier"),
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("rest-text") / "data", "--token", TOKEN).start()
    r = httpx.post(f"{proc.url}/v1/namespaces", headers=AUTH, timeout=30, json={
        "name": "text", "block_bytes": 4096, "layout": {"model_id": "m", "block_size": 16}})
    assert r.status_code == 201, r.text
    yield proc
    proc.stop()


@pytest.mark.parametrize(("path", "body", "field"), CASES, ids=[c[2] for c in CASES])
def test_a_lone_surrogate_is_a_400_naming_the_field(srv: ServerProc, path: str, body: str,
                                                     field: str) -> None:
    r = httpx.post(f"{srv.url}{path}", headers=AUTH, content=(body % LONE).encode(),
                   timeout=30)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    doc = r.json()
    assert doc["error"] == "invalid_text" and doc["message"].startswith(f"{field}: "), doc
    assert "Unicode" in doc["message"]
    assert "Traceback" not in srv.log(200_000)
