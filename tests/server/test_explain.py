"""``POST /v1/explain`` and ``kvstore explain`` against real servers on loopback: one test per
cause of a miss (stored, evicted, never seen, another namespace's recipe), tenant scoping and
bad input.

Every test explains its own prompt (:func:`prompt`): an explain looks at every namespace the
caller sees, so two tests on one server must not store the same tokens.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from kvstore.client import KVStoreClient
from kvstore.keys import BlockHasher
from kvstore.testing.proc import ROOT
from kvstore.testing.server import ServerProc, kvstore_cmd
from kvstore.types import BlockHash
from server.rest.limits import EXPLAIN_BODY_BYTES
from server.rest.schemas import MAX_EXPLAIN_TOKENS

BLOCK = 4096
MAX_BATCH = 8  # blocks one explain may have on the module's server


@pytest.fixture
def prompt(ns_name: str) -> list[int]:
    """100 token ids of this test's own (6 blocks of 16 tokens and 4 tail tokens)."""
    rng = random.Random(ns_name)
    return [rng.randrange(1 << 17) for _ in range(100)]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("explain") / "data", "--max-batch",
                      str(MAX_BATCH)).start()
    yield proc
    proc.stop()


def register(url: str, name: str, *, block_size: int = 16, algo: str = "sha256",
             seed: str | None = None, token: str | None = None) -> None:
    with KVStoreClient(url, token=token) as kv:
        kv.register_namespace(name, BLOCK, {"model_id": "m", "block_size": block_size},
                              hash_algo=algo, hash_seed=seed)


def store_chain(url: str, name: str, hashes: list[BlockHash], *, token: str | None = None,
                durable: bool = False) -> None:
    with KVStoreClient(url, token=token) as kv:
        kv.put(name, hashes, [b"v" * BLOCK] * len(hashes), durable=durable)


def chain(tokens: list[int], block_size: int = 16, algo: str = "sha256",
          seed: str | None = None, **keys: Any) -> list[BlockHash]:
    return BlockHasher(algo, seed, block_size).hash_blocks(tokens, **keys)


def explain(url: str, name: str, tokens: list[Any], token: str | None = None,
            **extra: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}/v1/explain", json={"namespace": name, "tokens": tokens, **extra},
                      headers=headers, timeout=60)


def kv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvstore_cmd(), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_stored_blocks_name_every_tier_holding_them(srv: ServerProc, ns_name: str,
                                                     prompt: list[int]) -> None:
    register(srv.url, ns_name)
    hashes = chain(prompt, cache_salt="s", lora_name="ad", lora_path="/ad")
    store_chain(srv.url, ns_name, hashes[:2])
    store_chain(srv.url, ns_name, hashes[2:3], durable=True)  # straight to the disk tier
    r = explain(srv.url, ns_name, prompt, cache_salt="s", lora_name="ad", lora_path="/ad")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert [b["hash"] for b in doc["blocks"]] == [h.hex() for h in hashes]  # the engine's chain
    assert [b["status"] for b in doc["blocks"]] == ["stored"] * 3 + ["never_seen"] * 3
    assert [b["tiers"] for b in doc["blocks"][:3]] == [["host"], ["host"], ["disk"]]
    assert doc["recipe"] == {"hash_algo": "sha256", "hash_seed": None, "block_size": 16}
    assert (doc["prefix_blocks"], doc["prefix_tokens"], doc["first_miss"]) == (3, 48, 3)
    assert (doc["tokens"], doc["tail_tokens"]) == (100, 4)
    assert doc["blocks"][5] | {"hash": ""} == {
        "index": 5, "start": 80, "end": 96, "hash": "", "status": "never_seen", "tiers": [],
        "ghost": None, "other": []}


def test_a_full_hit_prints_no_hints(srv: ServerProc, ns_name: str, prompt: list[int]) -> None:
    register(srv.url, ns_name)
    whole = prompt[:96]  # 6 full blocks, no tail
    store_chain(srv.url, ns_name, chain(whole))
    run = kv("explain", "--url", srv.url, "--namespace", ns_name, "--tokens",
             " ".join(map(str, whole)))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1] == "96 tokens: 6 full blocks + 0 tail tokens; prefix hit 6 blocks (96 " \
        "tokens); first miss: none", lines
    assert lines[-1].startswith("0-5 ") and "hints:" not in run.stdout, run.stdout


def test_block_rows_come_in_pages_and_the_summary_is_the_whole_prompts(
        srv: ServerProc, ns_name: str, prompt: list[int]) -> None:
    register(srv.url, ns_name)
    store_chain(srv.url, ns_name, chain(prompt)[:3])
    rows: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:
        r = explain(srv.url, ns_name, prompt, offset=offset, limit=4)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert len(doc["blocks"]) <= 4
        assert (doc["prefix_blocks"], doc["counts"]["never_seen"]) == (3, 3)
        rows += doc["blocks"]
        offset = doc["next_offset"]
    assert [b["index"] for b in rows] == list(range(6))
    assert [b["status"] for b in rows] == ["stored"] * 3 + ["never_seen"] * 3
    r = explain(srv.url, ns_name, prompt, limit=1025)
    assert r.status_code == 422 and r.json()["message"].startswith("body.limit: "), r.text


def test_evicted_blocks_say_when_and_from_which_tier(
        make_server: Callable[..., ServerProc], ns_name: str, prompt: list[int]) -> None:
    """A host tier of 16 slots and no disk: blocks pushed out leave the store, and the ghost
    record says when and from where."""
    small = make_server("--host-slot-bytes", str(BLOCK), host_capacity="64KiB",
                        disk_capacity="0")
    register(small.url, ns_name)
    hashes = chain(prompt)
    before = time.time()
    store_chain(small.url, ns_name, hashes)
    filler = [BlockHash(bytes([i]) * 32) for i in range(16)]
    store_chain(small.url, ns_name, filler)  # pushes the prompt's blocks out
    doc = explain(small.url, ns_name, prompt).json()
    assert [b["status"] for b in doc["blocks"]] == ["evicted"] * 6
    for b in doc["blocks"]:
        assert b["ghost"]["tier"] == "host" and b["ghost"]["why"] == "evicted"
        assert before <= b["ghost"]["at"] <= time.time()
    assert doc["first_miss"] == 0 and doc["counts"]["evicted"] == 6
    assert any(h.startswith("6 blocks evicted from the host tier") and "host_capacity" in h
               for h in doc["hints"]), doc["hints"]

    run = kv("explain", "--url", small.url, "--namespace", ns_name, "--tokens",
             ",".join(map(str, prompt)))
    assert run.returncode == 0, run.stderr
    row = next(line for line in run.stdout.splitlines() if line.startswith("0-5 "))
    assert row.split()[:6] == ["0-5", "0-95", "evicted", "evicted", "from", "host,"], row


def test_never_seen_blocks(srv: ServerProc, ns_name: str, prompt: list[int]) -> None:
    register(srv.url, ns_name)
    doc = explain(srv.url, ns_name, prompt).json()
    assert doc["counts"] == {"stored": 0, "evicted": 0, "other_recipe": 0, "never_seen": 6}
    assert (doc["prefix_blocks"], doc["first_miss"]) == (0, 0)
    assert any(h.startswith("6 blocks never stored in this namespace") for h in doc["hints"])


@pytest.mark.parametrize("other,differs,words", [
    ({"seed": "42"}, ["hash_seed"], "PYTHONHASHSEED differs: unset vs '42'"),
    ({"block_size": 32}, ["block_size"], "block size 16 vs 32"),
    ({"algo": "sha256_cbor"}, ["hash_algo"], "hash algorithm sha256 vs sha256_cbor"),
])
def test_blocks_stored_under_another_recipe_name_the_mismatch(
        srv: ServerProc, ns_name: str, prompt: list[int], other: dict[str, Any],
        differs: list[str], words: str) -> None:
    register(srv.url, ns_name)
    theirs = f"{ns_name}-other"
    register(srv.url, theirs, **other)
    store_chain(srv.url, theirs, chain(prompt, **other))
    doc = explain(srv.url, ns_name, prompt).json()
    assert [b["status"] for b in doc["blocks"]] == ["other_recipe"] * 6
    assert all(b["other"] == [{"namespace": theirs, "differs": differs}] for b in doc["blocks"])
    assert [(e["namespace"], e["differs"], e["blocks"]) for e in doc["elsewhere"]] == [
        (theirs, differs, 6)]
    assert any(f"namespace {theirs!r} holds the tokens of 6 blocks" in h and words in h
               for h in doc["hints"]), doc["hints"]

    run = kv("explain", "--url", srv.url, "--namespace", ns_name, "--tokens",
             ",".join(map(str, prompt)))
    assert run.returncode == 0, run.stderr
    assert f"0-5     0-95    other_recipe  {theirs} ({differs[0]} differs)" in run.stdout
    assert words in run.stdout


def test_tenants_explain_and_see_only_their_own_namespaces(
        make_server: Callable[..., ServerProc], ns_name: str, prompt: list[int]) -> None:
    tokens = {"a": "tok-a", "b": "tok-b"}
    secured = make_server("--token", "admin",
                          env={"KVSTORE_TENANT_TOKENS": json.dumps(tokens)})
    mine, my_other, theirs = f"{ns_name}-a", f"{ns_name}-a32", f"{ns_name}-b"
    register(secured.url, mine, token="tok-a")
    register(secured.url, my_other, block_size=32, token="tok-a")
    register(secured.url, theirs, seed="9", token="tok-b")
    store_chain(secured.url, my_other, chain(prompt, block_size=32)[:1], token="tok-a")
    store_chain(secured.url, theirs, chain(prompt, seed="9"), token="tok-b")

    r = explain(secured.url, theirs, prompt, token="tok-a")  # b's name is unknown to a
    assert r.status_code == 404 and r.json()["error"] == "unknown_namespace"
    assert explain(secured.url, mine, prompt).status_code == 401
    doc = explain(secured.url, mine, prompt, token="tok-a").json()
    assert [e["namespace"] for e in doc["elsewhere"]] == [my_other]  # not tenant b's
    assert [b["status"] for b in doc["blocks"]] == ["other_recipe"] * 2 + ["never_seen"] * 4
    admin = explain(secured.url, f"a~{mine}", prompt, token="admin").json()
    assert sorted(e["namespace"] for e in admin["elsewhere"]) == [f"a~{my_other}",
                                                                   f"b~{theirs}"]
    assert [b["status"] for b in admin["blocks"]] == ["other_recipe"] * 6


def test_bad_input_is_a_clear_4xx(srv: ServerProc, ns_name: str, prompt: list[int]) -> None:
    register(srv.url, ns_name)
    r = explain(srv.url, "no-such-namespace", prompt)
    assert r.status_code == 404 and r.json()["error"] == "unknown_namespace"
    for bad in ("12", True, 1.5, -1, 1 << 32, None):
        r = explain(srv.url, ns_name, tokens=[1, bad])
        assert r.status_code == 422 and r.json()["message"].startswith("body.tokens.1"), bad
    r = explain(srv.url, ns_name, tokens=[0] * (MAX_EXPLAIN_TOKENS + 1))
    assert r.status_code == 422 and "at most 262144" in r.json()["message"]
    r = httpx.post(f"{srv.url}/v1/explain", content=b" " * (EXPLAIN_BODY_BYTES + 1),
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "of an explain" in r.json()["message"]
    r = explain(srv.url, ns_name, tokens=list(range(16 * (MAX_BATCH + 1))))
    assert r.status_code == 422 and r.json() == {
        "error": "invalid_request",
        "message": f"the prompt has {MAX_BATCH + 1} full blocks of 16 tokens, over the limit "
                   f"of {MAX_BATCH} blocks an explain examines (max_batch, at most 16384)"}
    r = explain(srv.url, ns_name, prompt, lora_name="only-a-name")
    assert r.status_code == 422 and "lora_name and lora_path go together" in r.json()["message"]
    r = explain(srv.url, ns_name, prompt, salt="typo")
    assert r.status_code == 422 and r.json()["error"] == "validation"
    with KVStoreClient(srv.url) as client:
        client.register_namespace(f"{ns_name}-bare", BLOCK, {"model_id": "m"})
    r = explain(srv.url, f"{ns_name}-bare", prompt)
    assert r.status_code == 422 and "without layout.block_size" in r.json()["message"]

    for args, line in [
        (["--namespace", "no-such-namespace", "--tokens", "1,2"],
         "kvstore explain: server answered 404 unknown_namespace: unknown namespace "
         "'no-such-namespace'"),
        (["--namespace", ns_name, "--tokens", "1,x"],
         "kvstore explain: --tokens: token ids must be non-negative integers; item 1 is x"),
        (["--namespace", ns_name, "--tokens", "1", "--lora", "ad"],
         "kvstore explain: --lora and --lora-path go together: vLLM hashes the adapter's name "
         "and path"),
    ]:
        run = kv("explain", "--url", srv.url, *args)
        assert run.returncode == 2 and run.stderr.strip().splitlines() == [line], run.stderr
