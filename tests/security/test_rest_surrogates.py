"""Text that is not valid Unicode in a request to ``kvstore serve``'s REST API: a lone
surrogate (JSON ``"\\ud800"``) in any string field is a 422 with a message, like any other
invalid field. Before, rendering the validation error, which quotes the input, failed on the
surrogate and the server dropped the connection with a traceback in its log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.testing.server import ServerProc

NAMESPACE = ('{"name": "chat", "block_bytes": 64, "layout": {"num_layers": 1, '
             '"num_kv_heads": 1, "head_dim": 8, "block_size": 4, "dtype": "float16"}')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(Path(tmp_path_factory.mktemp("surrogates")) / "data").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("path,body", [
    ("/v1/namespaces", NAMESPACE + ', "hash_seed": "\\ud800"}'),
    ("/v1/namespaces", NAMESPACE.replace('"chat"', '"\\udc00"') + "}"),
    ("/v1/explain", '{"namespace": "chat", "tokens": [1, 2, 3, 4], "cache_salt": "\\ud800"}'),
    ("/v1/explain", '{"namespace": "chat", "tokens": [1], "lora_name": "\\ud800", '
                    '"lora_path": "p"}'),
    ("/v1/explain", '{"namespace": "\\ud800", "tokens": [1]}'),
])
def test_a_lone_surrogate_is_a_422_with_a_message(server: ServerProc, path: str,
                                                   body: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        c.post("/v1/namespaces", content=NAMESPACE + "}",
               headers={"content-type": "application/json"})
        r = c.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        doc = r.json()
        assert doc["error"] == "validation" and "valid string" in doc["message"]
        assert c.get("/healthz").status_code == 200
    assert "Traceback" not in server.log()
