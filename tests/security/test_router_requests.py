"""Requests that must fail alone, or not see each other, on a real ``kvstore-router`` and
worker: sampling values the sampler cannot use are 400s in OpenAI's shape (tiny positive
temperatures and top_p are greedy, as in vLLM), a lone surrogate in the text is a 400, and
``cache_salt`` keeps one user's cached prefix from another's ``cached_tokens``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.security.router_env import RouterEnv, router_env

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterEnv]:
    with router_env(tmp_path_factory.mktemp("router-requests")) as e:
        yield e


@pytest.fixture(scope="module")
def client(env: RouterEnv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{env.router.url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.mark.parametrize("bad", [{"temperature": 2.5}, {"temperature": 1e300},
                                 {"seed": 1 << 64}, {"seed": -(1 << 63) - 1}])
def test_sampling_values_the_sampler_cannot_use_are_400s(client: openai.OpenAI,
                                                          env: RouterEnv,
                                                          bad: dict[str, Any]) -> None:
    before = env.worker_stats()["requests"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model(client), prompt=[5], max_tokens=1,
                                  **bad)  # type: ignore[call-overload]
    assert e.value.status_code == 400
    body: Any = e.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == next(iter(bad))
    assert env.worker_stats()["requests"] == before  # refused before any worker


def test_tiny_temperature_and_top_p_are_greedy_and_fail_nothing(client: openai.OpenAI,
                                                                env: RouterEnv) -> None:
    # the review's requests: each made the worker's engine step raise, failing every request
    # in flight and marking the worker down
    name = model(client)
    greedy = client.completions.create(model=name, prompt=[5, 6, 7], max_tokens=8,
                                       temperature=0, extra_body={"ignore_eos": True})
    for extra in ({"temperature": 1e-40}, {"temperature": 1.0, "top_p": 1e-300},
                  {"temperature": 1e-6, "seed": 3}):
        r = client.completions.create(model=name, prompt=[5, 6, 7], max_tokens=8,
                                      extra_body={"ignore_eos": True},
                                      **extra)  # type: ignore[call-overload]
        assert r.choices[0].text == greedy.choices[0].text, extra
    health = httpx.get(f"{env.router.url}/health", timeout=10).json()
    assert health["ready"] and health["workers_up"] == 1


@pytest.mark.parametrize("route,body", [
    ("completions", '{"prompt": "w5 \\ud800 w6", "max_tokens": 1}'),
    ("completions", '{"prompt": ["w5", "\\udfff"], "max_tokens": 1}'),
    ("chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud83d"}]}'),
    ("completions", '{"prompt": [5], "max_tokens": 1, "model": "\\ud800"}'),
])
def test_a_lone_surrogate_is_a_400(env: RouterEnv, route: str, body: str) -> None:
    r = httpx.post(f"{env.router.url}/v1/{route}", content=body, timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "lone surrogate" in err["message"] and err["type"] == "invalid_request_error"


def test_cache_salt_keeps_cached_tokens_within_one_salt(client: openai.OpenAI) -> None:
    name = model(client)
    prompt = list(range(20, 40))  # 5 blocks of 4 tokens

    def cached(salt: str | None) -> int:
        extra: dict[str, Any] = {"ignore_eos": True}
        if salt is not None:
            extra["cache_salt"] = salt
        r = client.completions.create(model=name, prompt=prompt, max_tokens=1, temperature=0,
                                      extra_body=extra)
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens_details.cached_tokens or 0

    assert cached("alice") == 0  # first seen
    assert cached("alice") == 16  # the same user hits its own prefix (all but the last block)
    assert cached("bob") == 0  # another user learns nothing of alice's prompt
    assert cached(None) == 0  # nor does a request without a salt
    assert cached("bob") == 16 and cached(None) == 16  # each cached under its own salt
    with pytest.raises(openai.BadRequestError):
        cached("")  # an empty salt is refused, as vLLM does
