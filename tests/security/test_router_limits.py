"""What one request may ask of a real ``kvstore-router``: a body over the cap is refused
before it is read (413), a prompt over the model's context and a fan-out over the choices cap
are 400s that never reach a worker (a text prompt is tokenized first, in a thread), and stop
strings over their caps are 400s. The request deadline is in ``test_router_deadline.py``,
stop-string matching in ``test_router_stops.py``."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.security.router_env import RouterEnv, router_env

pytestmark = pytest.mark.slow

CONTEXT = 512  # the worker's max_model_len: 128 blocks of 4 tokens, 512 positions
MAX_STOPS = 16  # stop strings per request


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterEnv]:
    with router_env(tmp_path_factory.mktemp("router-limits")) as e:
        yield e


def _response(sock: socket.socket) -> bytes:
    """Read one whole response: the head, then as many body bytes as it declares (the server
    may write them apart, and may close the connection at once after them)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            lengths = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")]
            if sep and lengths and len(body) >= lengths[0]:
                break
    return data


def post(env: RouterEnv, body: dict[str, Any], timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{env.router.url}/v1/completions", json=body, timeout=timeout)


def test_a_body_over_the_cap_is_refused_before_it_is_read(env: RouterEnv) -> None:
    # 64 MiB declared (the default cap is 8 MiB), 1 KiB sent: the answer comes without the rest
    with socket.create_connection(("127.0.0.1", env.router.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 67108864\r\n\r\n")
        s.sendall(b"[" * 1024)
        head = _response(s).decode()
    assert head.startswith("HTTP/1.1 413"), head
    assert "--max-body-bytes" in head and '"type":"invalid_request_error"' in head
    assert httpx.get(f"{env.router.url}/health", timeout=10).json()["ready"]


def test_an_undeclared_length_over_the_cap_is_refused_too(env: RouterEnv) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(9):  # 9 MiB, chunked
            yield b" " * (1 << 20)

    r = httpx.post(f"{env.router.url}/v1/completions", content=chunks(), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]


def test_a_prompt_over_the_context_never_reaches_a_worker(env: RouterEnv) -> None:
    before = env.worker_stats()["requests"]
    r = post(env, {"prompt": [5] * (CONTEXT + 1), "max_tokens": 1})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and f"{CONTEXT + 1} tokens" in err["message"]
    r = post(env, {"prompt": "w5 " * (CONTEXT + 1), "max_tokens": 1})  # text: tokenized first
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = post(env, {"prompt": [5] * (CONTEXT - 10), "max_tokens": 11})
    assert r.status_code == 400 and "maximum context length is 512" in r.json()["error"]["message"]
    assert env.worker_stats()["requests"] == before
    assert post(env, {"prompt": [5] * (CONTEXT - 10), "max_tokens": 10}).status_code == 200


def test_prompts_times_n_over_the_cap_never_reaches_a_worker(env: RouterEnv) -> None:
    before = env.worker_stats()["requests"]
    r = post(env, {"prompt": [[5, 6]] * 17, "n": 16, "max_tokens": 1})  # 272 > 256 choices
    assert r.status_code == 400
    assert "272 choices" in r.json()["error"]["message"]
    r = post(env, {"prompt": ["w5 w6"] * 300, "max_tokens": 1})
    assert r.status_code == 400 and "300 choices" in r.json()["error"]["message"]
    assert env.worker_stats()["requests"] == before


def test_stop_strings_over_their_caps_are_refused(env: RouterEnv) -> None:
    # the review's case: 10 stop strings of 20k characters
    r = post(env, {"prompt": [5], "max_tokens": 1, "stop": ["w7" * 10_000] * 10})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    r = post(env, {"prompt": [5], "max_tokens": 1,
                   "stop": [f"w{i}" for i in range(MAX_STOPS + 1)]})
    assert r.status_code == 400 and f"at most {MAX_STOPS}" in r.json()["error"]["message"]
