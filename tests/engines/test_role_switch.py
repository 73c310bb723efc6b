"""A worker's role switches at run time (``POST /admin/role``) without a restart: requests in
flight finish whole (the same tokens as without the switch), new requests see the new role,
and the router learns it and routes accordingly. Real workers, router and ``kvstore serve`` on
loopback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.store_io import open_store
from engines.testing import ThreadServer, engine_proc
from engines.worker import create_app as worker_app
from kvstore.testing.cli import assert_one_line
from kvstore.testing.proc import console_script
from kvstore.testing.server import ServerProc

ECFG = EngineConfig(block_size=4, num_blocks=128, max_batch_tokens=64)
TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}  # every worker route but /health needs it
PROMPTS = [[7 + i, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21 + i] for i in range(4)]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path_factory.mktemp("kv")).start()
    yield s
    s.stop()


def want(model: Path, prompt: list[int]) -> list[int]:
    return Engine(model, ECFG).generate(
        [prompt], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))[0]


def worker(model: Path, store: ServerProc, role: str) -> ThreadServer:
    return ThreadServer(worker_app(Engine(model, ECFG, open_store(store.url)), role=role,
                                   token=TOKEN)).start()


def switch(url: str, role: str, token: str | None = TOKEN) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}/admin/role", json={"role": role}, headers=headers, timeout=30)


def test_switch_keeps_a_stream_in_flight_whole(gqa_model: Path, store: ServerProc) -> None:
    w = worker(gqa_model, store, "decode")
    try:
        body = {"prompt_ids": PROMPTS[0], "max_tokens": MAX_TOKENS, "ignore_eos": True,
                "stream": True}
        got: list[int] = []
        with httpx.stream("POST", f"{w.url}/generate", json=body, headers=AUTH,
                          timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if "token_id" in doc:
                    got.append(doc["token_id"])
                    if len(got) == 2:  # mid-generation: the worker becomes a prefill worker
                        assert switch(w.url, "prefill", token=None).status_code == 401
                        assert switch(w.url, "prefill", token="wrong").status_code == 401
                        r2 = switch(w.url, "prefill")
                        assert r2.json() == {"role": "prefill", "previous": "decode",
                                             "switches": 1}
        assert got == want(gqa_model, PROMPTS[0])
        # new requests see the new role; the refusal names it for routers
        r = httpx.post(f"{w.url}/generate", json={"prompt_ids": PROMPTS[1]}, headers=AUTH,
                       timeout=60)
        assert r.status_code == 409 and r.headers["x-kvstore-role"] == "prefill"
        assert httpx.post(f"{w.url}/prefill", json={"prompt_ids": PROMPTS[1]}, headers=AUTH,
                          timeout=60).status_code == 200
        assert httpx.get(f"{w.url}/info", headers=AUTH).json()["role"] == "prefill"
        assert switch(w.url, "sideways").status_code == 400
        lat = httpx.get(f"{w.url}/latency", headers=AUTH).json()
        assert [f["kind"] for f in lat["finished"]] == ["generate", "prefill"]
        assert lat["finished"][0]["itl_s"] > 0 and lat["finished"][0]["tokens"] == MAX_TOKENS
        later = httpx.get(f"{w.url}/latency", params={"since": lat["cursor"]}, headers=AUTH)
        assert later.json()["finished"] == []
    finally:
        w.stop()


def test_prefill_needs_a_store(gqa_model: Path) -> None:
    w = ThreadServer(worker_app(Engine(gqa_model, ECFG), token=TOKEN)).start()
    try:
        r = switch(w.url, "prefill")
        assert r.status_code == 409 and "kvstore" in r.json()["detail"]
    finally:
        w.stop()


def test_router_learns_the_switch_and_drops_nothing(gqa_model: Path,
                                                    store: ServerProc) -> None:
    a, b = worker(gqa_model, store, "decode"), worker(gqa_model, store, "decode")
    p = worker(gqa_model, store, "prefill")
    router = ThreadServer(router_app(Router([a.url, b.url], prefill_workers=[p.url],
                                            kvstore=store.url, worker_token=TOKEN))).start()
    wants = [want(gqa_model, q) for q in PROMPTS]

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> list[int]:
        r = await client.post(f"{router.url}/v1/completions", json={
            "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return list(r.json()["choices"][0]["token_ids"])

    async def wave() -> list[list[int]]:
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.create_task(one(client, q)) for q in PROMPTS]
            # switch a decoder while some of the wave's generations run on it
            while (await client.get(f"{a.url}/stats", headers=AUTH)).json()["inflight"] == 0:
                await asyncio.sleep(0.01)
            r = await client.post(f"{a.url}/admin/role", json={"role": "prefill"},
                                  headers={"authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200
            return await asyncio.gather(*tasks)

    try:
        assert asyncio.run(wave()) == wants
        deadline = time.monotonic() + 30
        while httpx.get(f"{router.url}/stats").json()["workers"][a.url]["role"] != "prefill":
            assert time.monotonic() < deadline, "the router never learned the new role"
            time.sleep(0.2)
        # with the first prefill worker gone, a is the only one: the router sends it the
        # prefills, and never a generation
        p.stop()
        before = httpx.get(f"{a.url}/stats", headers=AUTH).json()
        assert asyncio.run(wave_after(router.url)) == wants
        after = httpx.get(f"{a.url}/stats", headers=AUTH).json()
        assert after["requests"] == before["requests"]
        assert after["prefills"] == before["prefills"] + len(PROMPTS)
    finally:
        for s in (router, a, b, p):
            s.stop()


async def wave_after(url: str) -> list[list[int]]:
    async with httpx.AsyncClient(timeout=120) as client:
        out = []
        for q in PROMPTS:
            r = await client.post(f"{url}/v1/completions", json={
                "prompt": q, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            out.append(list(r.json()["choices"][0]["token_ids"]))
        return out


def test_engine_process_takes_its_token_from_a_file(gqa_model: Path, tmp_path: Path) -> None:
    engine = console_script("kvstore-engine", "engines.cli")
    done = subprocess.run([*engine, "serve", "--model", str(gqa_model), "--device", "cpu",
                           "--token-file", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=300)
    assert_one_line(done, "--token-file", "missing")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    w = engine_proc(gqa_model, args=("--token-file", str(token_file))).start()
    try:
        assert switch(w.url, "decode", token=None).status_code == 401
        assert switch(w.url, "decode").json()["role"] == "decode"
        assert httpx.get(f"{w.url}/info", headers=AUTH).json()["role"] == "decode"
    finally:
        w.stop()
