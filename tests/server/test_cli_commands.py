"""The ``kvstore`` commands that ask a running server (``stats``, ``namespaces list|show|delete``,
``health``) and their REST routes, against real servers on loopback (``--url`` with or without
``http://``); and ``stats``' bytes: logical and charged, each where it means something."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from kvstore.cli_client import format_namespaces
from kvstore.client import KVStoreClient
from kvstore.namespace import Layout, Namespace
from kvstore.testing.proc import ROOT
from kvstore.testing.server import ServerProc, kvstore_cmd
from kvstore.types import BlockHash


def kv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvstore_cmd(), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, **(env or {})})


def fill(server: ServerProc, ns: str, n: int, size: int = 1000) -> None:
    with KVStoreClient(server.url) as c:
        c.register_namespace(ns, size, {"model_id": ns})
        c.put(ns, [BlockHash(bytes([i + 1]) * 32) for i in range(n)], [b"x" * size] * n)


def test_stats_bytes_logical_and_charged(server: ServerProc, ns_name: str) -> None:
    """1000-byte blocks in the host tier's 64 KiB slots: the tier charges whole slots,
    the totals and the namespace count the blocks' own bytes."""
    fill(server, ns_name, 3)
    doc = httpx.get(f"{server.url}/v1/stats").json()
    host, ns, totals = doc["tiers"]["host"], doc["namespaces"][ns_name], doc["totals"]
    assert ns["bytes"] == 3000 and ns["blocks"] == 3
    assert host["logical_bytes"] >= 3000 and host["bytes"] > host["logical_bytes"]
    assert totals["charged_bytes"] == sum(t["bytes"] for t in doc["tiers"].values())
    assert totals["bytes"] == sum(v["bytes"] for v in doc["namespaces"].values())

    run = kv("stats", "--url", server.url)
    assert run.returncode == 0, run.stderr
    head, *rows = run.stdout.splitlines()
    assert head.split()[:4] == ["blocks", "logical", "charged", "capacity"]
    row = next(r.split() for r in rows if r.startswith(f"ns {ns_name}"))
    assert row[3:5] == ["2.9KiB", "-"]  # logical 3000 bytes; a namespace charges nothing alone
    tier = next(r.split() for r in rows if r.startswith("tier host"))
    assert tier[-9] == "64.0MiB"  # capacity, human-readable


def test_stats_prints_the_servers_error_not_json(
        make_server: Callable[..., ServerProc]) -> None:
    srv = make_server("--token", "right")
    run = kv("stats", "--url", srv.url, "--token", "wrong")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        "kvstore stats: server answered 401 unauthenticated: invalid bearer token"], run.stderr


def test_namespaces_list_show_delete(server: ServerProc, ns_name: str) -> None:
    fill(server, ns_name, 2)
    run = kv("namespaces", "list", "--url", server.url)
    head, *rows = [line.split() for line in run.stdout.splitlines()]
    assert run.returncode == 0 and head == ["name", "tenant", "block_bytes", "block_size",
                                            "hash_algo", "hash_seed"], run.stdout
    assert [ns_name, "-", "1000B", "-", "sha256", "-"] in rows, run.stdout
    run = kv("namespaces", "show", "--url", server.url, ns_name)
    assert run.returncode == 0, run.stderr
    shown = dict(line.split(None, 1) for line in run.stdout.splitlines())
    assert shown["name"] == ns_name and shown["blocks"] == "2"
    assert shown["hash_algo"] == "sha256" and json.loads(shown["layout"])["model_id"] == ns_name
    doc = json.loads(kv("namespaces", "show", "--json", "--url", server.url, ns_name).stdout)
    assert doc["stats"]["blocks"] == 2 and doc["stats"]["bytes"] == 2000

    run = kv("namespaces", "delete", "--url", server.url, ns_name)
    assert run.returncode == 0 and f"deleted namespace {ns_name} (2 blocks)" in run.stdout
    for verb in ("show", "delete"):
        run = kv("namespaces", verb, "--url", server.url, ns_name)
        assert run.returncode == 2 and "Traceback" not in run.stderr
        assert run.stderr.strip().splitlines() == [
            f"kvstore namespaces: server answered 404 unknown_namespace: unknown namespace "
            f"'{ns_name}'"], run.stderr


def test_namespaces_list_is_a_table_under_a_header() -> None:
    spaces = [Namespace("llama-8b", 65536, Layout(block_size=16)),
              Namespace("long-name-x", 1000, hash_algo="xxhash_cbor", hash_seed="0",
                        tenant="a")]
    assert format_namespaces(spaces).splitlines() == [
        "name         tenant  block_bytes  block_size  hash_algo    hash_seed",
        "llama-8b     -       64.0KiB      16          sha256       -",
        "long-name-x  a       1000B        -           xxhash_cbor  0"]
    assert format_namespaces([]).splitlines() == [
        "name  tenant  block_bytes  block_size  hash_algo  hash_seed", "(no namespaces)"]


def test_show_route_of_a_namespace_without_traffic(server: ServerProc, ns_name: str) -> None:
    with KVStoreClient(server.url) as c:
        c.register_namespace(ns_name, 64, {})
    r = httpx.get(f"{server.url}/v1/namespaces/{ns_name}")
    assert r.status_code == 200, r.text
    assert r.json()["block_bytes"] == 64 and r.json()["stats"]["blocks"] == 0
    assert httpx.get(f"{server.url}/v1/namespaces/nope-{ns_name}").status_code == 404


def test_health(server: ServerProc) -> None:
    run = kv("health", "--url", server.url)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == f"{server.url}: ok"
    assert any(line.startswith("  tier host: ok") for line in lines)
    assert json.loads(kv("health", "--json", "--url", server.url).stdout)["ok"] is True


def test_unreachable_server_is_one_line(server: ServerProc) -> None:
    url = "http://127.0.0.1:9"  # the discard port: nothing listens there
    for cmd in (("stats",), ("health",), ("namespaces", "list")):
        run = kv(*cmd, "--url", url)
        assert run.returncode == 1 and "Traceback" not in run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and f"cannot reach {url}" in lines[0] and "--url" in lines[0]


class Answers(BaseHTTPRequestHandler):
    """A web server that is no kvstore: 200 and the same body for every request."""

    body = b""

    def answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = do_DELETE = answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=[b"{}", b"<html>welcome</html>", b'{"namespaces": [{"name": 1}], '
                        b'"name": "x", "blocks": "many", "prefix_blocks": 1, "tiers": 5}'])
def not_kvstore(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Answers", (Answers,), {"body": request.param})
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        yield f"127.0.0.1:{web.server_address[1]}"
        web.shutdown()


def test_a_url_that_is_no_kvstore_is_one_line(not_kvstore: str) -> None:
    for cmd in (("stats",), ("health",), ("namespaces", "list"), ("namespaces", "show", "x"),
                ("namespaces", "delete", "x"), ("lookup", "ns", "00"), ("cluster", "status"),
                ("explain", "--namespace", "n", "--tokens", "1")):
        run = kv(*cmd, "--url", not_kvstore)
        assert run.returncode == 2 and "Traceback" not in run.stderr, (cmd, run.stderr)
        lines = run.stderr.splitlines()
        assert len(lines) == 1 and "did not answer with" in lines[0] and \
            lines[0].endswith("is --url a kvstore server?"), (cmd, lines)


def test_a_url_without_its_scheme_is_http(server: ServerProc) -> None:
    bare = server.url.removeprefix("http://")  # 127.0.0.1:PORT, as a user types it
    for cmd in (("stats",), ("namespaces", "list"), ("health",)):
        run = kv(*cmd, "--url", bare + "/")
        assert run.returncode == 0 and run.stderr == "", (cmd, run.stderr)
    run = kv("health", env={"KVSTORE_URL": bare})
    assert run.stdout.splitlines()[0] == f"{server.url}: ok", run.stdout
    run = kv("stats", "--url", "ftp://" + bare)
    assert run.returncode == 2 and run.stderr.splitlines() == [
        f"kvstore stats: argument --url: 'ftp://{bare}' is not an http:// or https:// URL "
        "(see kvstore stats --help)"], run.stderr


def test_without_a_url_the_commands_find_the_server_at_kvstore_port(server: ServerProc) -> None:
    """The environment that told ``kvstore serve`` its port tells the client commands too."""
    port = server.url.rsplit(":", 1)[1]
    env = {k: v for k, v in os.environ.items() if k != "KVSTORE_URL"}
    run = subprocess.run([*kvstore_cmd(), "health"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env={**env, "KVSTORE_PORT": port})
    assert run.returncode == 0 and run.stdout.splitlines()[0] == f"{server.url}: ok", run
    run = subprocess.run([*kvstore_cmd(), "health"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env={**env, "KVSTORE_PORT": port,
                                        "KVSTORE_URL": "127.0.0.1:1"})
    assert run.returncode == 1 and "cannot reach http://127.0.0.1:1" in run.stderr, run


def test_a_token_variable_ending_in_a_newline_works_on_both_sides(
        make_server: Callable[..., ServerProc]) -> None:
    """A secret mounted as a variable often ends with a newline: the server and the client
    commands both drop it (no HTTP header could carry it); an empty token is refused."""
    srv = make_server(env={"KVSTORE_TOKEN": "s3cret\n"})
    assert httpx.get(f"{srv.url}/v1/stats",
                     headers={"Authorization": "Bearer s3cret"}).status_code == 200
    run = kv("stats", "--url", srv.url, env={"KVSTORE_TOKEN": "s3cret\n"})
    assert run.returncode == 0, run.stderr
    run = kv("serve", "--port", "1", env={"KVSTORE_TOKEN": "\n"})
    assert run.returncode == 2 and run.stderr.splitlines() == [
        "kvstore serve: invalid settings: token (--token, KVSTORE_TOKEN): a token must be one "
        "word: not empty, no spaces"], run.stderr
