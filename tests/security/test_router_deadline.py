"""A request's deadline on a real ``kvstore-router``: a request still generating
``--request-timeout`` seconds after it arrived ends with a 504 (or, once its stream has
started, an error event), and the worker's generation is cancelled rather than run to its
end. The worker is stopped with SIGSTOP mid-generation, so the deadline is what ends it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.security.router_env import RouterEnv, router_env

pytestmark = pytest.mark.slow

TIMEOUT_S = 3
LONG = {"prompt": [5, 6, 7, 8], "max_tokens": 4000, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterEnv]:
    with router_env(tmp_path_factory.mktemp("router-deadline"), context=4096,
                    worker_args=("--block-size", "4", "--num-blocks", "1100"),
                    router_args=("--request-timeout", str(TIMEOUT_S))) as e:
        yield e


def signal_worker(env: RouterEnv, sig: signal.Signals) -> None:
    assert env.worker.proc is not None
    os.kill(env.worker.proc.pid, sig)


def wait_idle(env: RouterEnv) -> dict[str, int]:
    deadline = time.monotonic() + 120
    while (stats := env.worker_stats())["inflight"]:
        assert time.monotonic() < deadline, "the worker kept generating"
        time.sleep(0.2)
    return stats


def test_a_request_past_its_deadline_is_a_504_and_its_generation_cancelled(
        env: RouterEnv) -> None:
    before = env.worker_stats()
    answers: list[httpx.Response] = []
    t = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{env.router.url}/v1/completions", json=LONG, timeout=120)))
    t.start()
    while env.worker_stats()["inflight"] == 0:  # the request is generating on the worker
        assert t.is_alive(), answers[0].text
        time.sleep(0.05)
    signal_worker(env, signal.SIGSTOP)
    try:
        t.join(timeout=120)
    finally:
        signal_worker(env, signal.SIGCONT)
    r = answers[0]
    assert r.status_code == 504, r.text
    assert "--request-timeout" in r.json()["error"]["message"]
    after = wait_idle(env)
    # an aborted generation is not counted; one run to its end would add 4000 tokens
    assert after["generated_tokens"] == before["generated_tokens"]
    assert httpx.get(f"{env.router.url}/health", timeout=10).json()["ok"]


def test_a_stream_past_its_deadline_ends_with_an_error_event(env: RouterEnv) -> None:
    wait_idle(env)
    before = env.worker_stats()
    events: list[str] = []
    try:
        with httpx.stream("POST", f"{env.router.url}/v1/completions",
                          json={**LONG, "stream": True}, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 1:  # the first token is out: stop the worker
                        signal_worker(env, signal.SIGSTOP)
    finally:
        signal_worker(env, signal.SIGCONT)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "--request-timeout" in error["message"]
    assert wait_idle(env)["generated_tokens"] == before["generated_tokens"]
