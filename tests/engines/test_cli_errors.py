"""``kvstore-engine``, ``kvstore-router`` and ``kvstore-planner`` refuse a start that cannot work
with one line on stderr naming the flag, exit code 2, no traceback (a misspelled flag or command
with the one meant); the router started before its workers
waits for them (503 with a message until one answers) and passes a worker's refusal on as the
worker's own message; a worker and a router that did start say where they listen."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from engines.cli import build_parser as engine_parser
from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.planner.cli import build_parser as planner_parser
from engines.testing import engine_proc, router_proc
from kvstore.testing.cli import assert_one_line, usage_error
from kvstore.testing.proc import ROOT, console_script, free_port

ENGINE = console_script("kvstore-engine", "engines.cli")
ROUTER = console_script("kvstore-router", "engines.router.cli")


def run(cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("parser,argv,words", [
    (engine_parser, ["generat"], ("did you mean 'generate'? (see kvstore-engine --help)",)),
    (engine_parser, ["generate", "--model", "m", "--prompt-ids", "1", "--max-tokns", "3"],
     ("kvstore-engine generate: unrecognized arguments: --max-tokns 3; did you mean "
      "--max-tokens? (see kvstore-engine generate --help)",)),
    (engine_parser, ["make-model", "--hiden", "64", "m"], ("did you mean --hidden?",)),
    (planner_parser, ["--routr", "http://127.0.0.1:8490"],
     ("kvstore-planner: unrecognized arguments: --routr; did you mean --router?",)),
])
def test_a_misspelled_flag_or_command_names_the_one_meant(
        parser: object, argv: list[str], words: tuple[str, ...]) -> None:
    line = usage_error(parser(), argv)  # type: ignore[operator]
    for word in words:
        assert word in line, line


@pytest.mark.parametrize("argv,words", [
    (["simulte", "--workers", "4"], ("kvstore-router: unknown command 'simulte'",
                                     "did you mean 'simulate'? (see kvstore-router --help)")),
    (["--wrkers", "127.0.0.1:8480"], ("unrecognized arguments: --wrkers; did you mean "
                                      "--workers? (see kvstore-router --help)",)),
])
def test_router_names_the_command_or_flag_meant(argv: list[str], words: tuple[str, ...]
                                                ) -> None:
    assert_one_line(run(ROUTER, *argv), *words)


def test_every_url_may_leave_out_http() -> None:
    from engines.planner.cli import settings_from
    from engines.router.cli import build_parser as router_parser

    args = planner_parser().parse_args(["--router", "127.0.0.1:8490"])
    assert settings_from(args).router == "http://127.0.0.1:8490"
    args = router_parser().parse_args(["--workers", "127.0.0.1:8480, https://w:1/",
                                       "--prefill-workers", "127.0.0.1:8482",
                                       "--kvstore", "127.0.0.1:8470"])
    assert (args.workers, args.prefill_workers, args.kvstore) == (
        ["http://127.0.0.1:8480", "https://w:1"], ["http://127.0.0.1:8482"],
        "http://127.0.0.1:8470")
    args = engine_parser().parse_args(["serve", "--model", "m", "--kvstore", "127.0.0.1:8470"])
    assert args.kvstore == "http://127.0.0.1:8470"
    for parser, argv in ((planner_parser, ["--router", "ftp://r"]),
                         (router_parser, ["--workers", "127.0.0.1:8480,ftp://w"]),
                         (engine_parser, ["serve", "--model", "m", "--kvstore", "ftp://k"])):
        line = usage_error(parser(), argv)  # type: ignore[operator]
        assert "is not an http:// or https:// URL" in line, line


def test_engine_model_folder_that_is_not_there(tmp_path: Path) -> None:
    assert_one_line(run(ENGINE, "generate", "--model", str(tmp_path / "nope"), "--prompt-ids",
                        "1,2,3", "--device", "cpu"), "--model", "nope")


def test_engine_prompt_ids_that_are_not_ids(gqa_model: Path) -> None:
    assert_one_line(run(ENGINE, "generate", "--model", str(gqa_model), "--prompt-ids", "a,b"),
                    "argument --prompt-ids: token ids must be non-negative integers; item 0 is a")
    for text in ("[5, 6]", "5,6", "5 6"):  # the one format of every command
        args = engine_parser().parse_args(["generate", "--model", "m", "--prompt-ids", text])
        assert args.prompt_ids == [5, 6]


def test_engine_unreachable_kvstore(gqa_model: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert_one_line(run(ENGINE, "generate", "--model", str(gqa_model), "--prompt-ids",
                        "1,2,3", "--device", "cpu", "--kvstore", url), "--kvstore", url)


def test_a_prompt_the_kv_cache_cannot_hold_says_by_how_much(gqa_model: Path) -> None:
    done = run(ENGINE, "generate", "--model", str(gqa_model), "--prompt-ids", "1 2 3 4 5",
               "--max-tokens", "8", "--num-blocks", "2", "--block-size", "4", "--device", "cpu")
    assert_one_line(done, "--prompt-ids: prompt plus max_tokens exceeds the KV cache: 5 prompt "
                    "tokens + max_tokens 8 = 13 tokens, and the cache holds 8 (2 blocks of 4 "
                    "tokens); shorten the prompt, lower max_tokens or raise num_blocks "
                    "(--num-blocks)")


@pytest.mark.parametrize("flag,value,says", [("--max-tokens", "-1", "max_tokens must be positive"),
                                             ("--top-p", "5", "top_p must be in (0, 1]")])
def test_engine_sampling_values_that_are_none(tmp_path: Path, flag: str, value: str,
                                             says: str) -> None:
    # refused before the model is looked for
    assert_one_line(run(ENGINE, "generate", "--model", str(tmp_path), "--prompt-ids", "1",
                        flag, value), says)


def test_engine_accepts_comma_separated_prompt_ids(gqa_model: Path) -> None:
    want = Engine(gqa_model, EngineConfig()).generate(
        [[5, 6, 7, 8]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    done = run(ENGINE, "generate", "--model", str(gqa_model), "--prompt-ids", "5,6,7,8",
               "--max-tokens", "4", "--ignore-eos", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == want


@pytest.mark.parametrize("cmd", ["engine", "router"])
def test_port_in_use(gqa_model: Path, listening: int, cmd: str) -> None:
    if cmd == "engine":
        done = run(ENGINE, "serve", "--model", str(gqa_model), "--device", "cpu", "--port",
                   str(listening))
    else:
        done = run(ROUTER, "--workers", "http://127.0.0.1:1", "--port", str(listening))
    assert_one_line(done, "--port", str(listening))


@pytest.mark.parametrize("files", [{}, {"tokenizer.json": "{}"}])
def test_router_tokenizer_that_does_not_load(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert_one_line(run(ROUTER, "--workers", "http://127.0.0.1:1", "--port", str(free_port()),
                        "--tokenizer", str(tmp_path)), "--tokenizer", str(tmp_path))


def complete(url: str, **body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60,
                      json={"max_tokens": 4, "temperature": 0, "ignore_eos": True, **body})


def test_router_waits_for_its_worker_then_serves_and_passes_refusals_on(
        gqa_model: Path) -> None:
    worker = engine_proc(gqa_model)  # its port is chosen; nothing listens there yet
    router = router_proc([worker.url]).start()
    try:
        r = complete(router.url, prompt=[1, 2, 3])
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json() == {"error": {
            "message": f"no worker is up ({worker.url} not answering yet); the router keeps "
                       "retrying them every 1 s",
            "type": "server_error", "param": None, "code": None}}
        assert httpx.get(f"{router.url}/health").json()["ready"] is False

        # each says where it listens once it does (the worker only now: it started later)
        assert (f"kvstore-router listening on {router.url} (policy kv, 1 worker, kvstore "
                "none)") in router.log()
        worker.start()
        assert (f"kvstore-engine worker listening on {worker.url} (model {gqa_model}, role "
                "both, device cpu, kvstore none)") in worker.log()
        deadline = time.monotonic() + 30
        while (r := complete(router.url, prompt=[1, 2, 3])).status_code == 503:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.2)
        assert r.status_code == 200, r.text + router.log()
        assert r.json()["kvstore"][0]["worker"] == worker.url

        # the worker's refusal, as the worker said it: a message, not a JSON string in a
        # string; streamed or not, a 400 before any event
        refused = {"error": {"message": "prompt token ids must be in [0, 97)",
                             "type": "invalid_request_error", "param": None, "code": None}}
        r = complete(router.url, prompt=[1000, 2])
        assert r.status_code == 400 and r.json() == refused, r.text
        r = complete(router.url, prompt=[1000, 2], stream=True)
        assert r.status_code == 400 and r.json() == refused, r.text
        # a refused request is not a failed worker: it still serves
        assert complete(router.url, prompt=[4, 5]).status_code == 200
        assert httpx.get(f"{router.url}/stats").json()["workers"][worker.url]["failures"] == 0
    finally:
        router.stop()
        worker.stop()
