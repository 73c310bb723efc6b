"""The official ``openai`` client against a real ``kvstore-router`` (with ``--tokenizer`` and
``--served-model-name``) and a real ``kvstore-engine serve`` worker on loopback: text and
token-id completions, chat through the chat template, streaming with usage, cached tokens on
a repeated prompt, stop strings, ``n``, refused parameters and a wrong model in OpenAI's
error shape, ``/v1/models``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from engines.router.app import create_app as router_app
from engines.router.core import Router
from engines.testing import ThreadServer, engine_proc, router_proc
from tests.engines.conftest import WORDS, make_tokenizer

pytestmark = pytest.mark.slow

SERVED = "tiny-chat"
GREEDY: dict[str, Any] = {"model": SERVED, "temperature": 0, "extra_body": {"ignore_eos": True}}
PROMPT = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
MESSAGES: list[Any] = [{"role": "system", "content": "w10 w11"},
                       {"role": "user", "content": "w12 w13 w14"}]


def words(ids: list[int]) -> str:
    return " ".join(WORDS[t] for t in ids)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def router_url(gqa_model: Path, tokenizer_dir: Path) -> Iterator[str]:
    worker = engine_proc(gqa_model, args=("--block-size", "4", "--num-blocks", "128"))
    router = router_proc([worker.url], args=("--tokenizer", str(tokenizer_dir),
                                             "--served-model-name", SERVED))
    worker.start(wait=False)
    router.start(wait=False)
    try:
        worker.wait_ready()
        router.wait_ready()
        deadline = time.monotonic() + 30
        while not httpx.get(f"{router.url}/health").json()["ready"]:
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        yield router.url
    finally:
        router.stop()
        worker.stop()


@pytest.fixture(scope="module")
def client(router_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def hf(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def test_models_lists_the_served_name(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [SERVED]
    assert client.models.retrieve(SERVED).owned_by == "kvstore"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found"


def test_a_wrong_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=1)
    assert e.value.param == "model" and "gpt-4o" in e.value.message
    assert e.value.body == {"message": e.value.body["message"],  # type: ignore[index]
                            "type": "invalid_request_error", "param": "model",
                            "code": "model_not_found"}
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=1)


def test_text_and_token_id_prompts(client: openai.OpenAI) -> None:
    by_ids = client.completions.create(prompt=PROMPT, max_tokens=4, **GREEDY)
    by_text = client.completions.create(prompt=words(PROMPT), max_tokens=4, **GREEDY)
    assert by_text.model == SERVED and by_text.object == "text_completion"
    choice = by_text.choices[0]
    assert choice.text == by_ids.choices[0].text
    assert choice.finish_reason == "length"
    out_ids = choice.model_extra["token_ids"]  # type: ignore[index]
    assert len(out_ids) == 4 and choice.text.split() == words(out_ids).split()
    assert by_text.usage is not None and by_ids.usage is not None
    assert by_text.usage.prompt_tokens == len(PROMPT) and by_text.usage.completion_tokens == 4
    batch = client.completions.create(prompt=[words(PROMPT), "w90 w91 w92"], max_tokens=2,
                                      **GREEDY)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.usage is not None and batch.usage.prompt_tokens == len(PROMPT) + 3


def test_chat_uses_the_chat_template(client: openai.OpenAI, hf: Any) -> None:
    reply = client.chat.completions.create(messages=MESSAGES, max_tokens=4, **GREEDY)
    ids = hf.encode(hf.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)
    assert ids[:2] == [1, WORDS.index("system")]  # <s>system: ...
    same = client.completions.create(prompt=ids, max_tokens=4, **GREEDY)
    assert reply.object == "chat.completion" and reply.model == SERVED
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == same.choices[0].text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.prompt_tokens == len(ids)
    parts = [{"role": "system", "content": [{"type": "text", "text": "w10 w11"}]},
             MESSAGES[1]]
    again = client.chat.completions.create(messages=parts, max_tokens=4, **GREEDY)
    assert again.choices[0].message.content == reply.choices[0].message.content


def test_streaming_with_usage(client: openai.OpenAI, router_url: str) -> None:
    whole = client.completions.create(prompt=PROMPT, max_tokens=5, **GREEDY)
    chunks = list(client.completions.create(prompt=PROMPT, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == len(PROMPT)

    reply = client.chat.completions.create(messages=MESSAGES, max_tokens=5, **GREEDY)
    stream = list(client.chat.completions.create(messages=MESSAGES, max_tokens=5, stream=True,
                                                 stream_options={"include_usage": True},
                                                 **GREEDY))
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == reply.choices[0].message.content
    assert stream[-1].usage is not None and stream[-1].usage.completion_tokens == 5

    # as curl sees it: OpenAI's SSE, ending with data: [DONE]
    body = {"model": SERVED, "prompt": "w20 w21", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{router_url}/v1/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)
    assert json.loads(lines[0][6:])["object"] == "text_completion"
    # the first token's chunk names its worker and where the time to it went; no other does
    first = json.loads(lines[0][6:])["kvstore"]
    assert first["index"] == 0 and first["worker"].startswith("http://")
    assert first["prefill_s"] > 0 and first["queue_s"] >= 0 and first["load_s"] == 0
    assert not any("kvstore" in json.loads(ln[6:]) for ln in lines[1:-1])


def test_cached_tokens_on_a_repeated_prompt(client: openai.OpenAI) -> None:
    prompt = [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73]  # 3 full blocks of 4
    first = client.completions.create(prompt=prompt, max_tokens=1, **GREEDY)
    again = client.completions.create(prompt=words(prompt), max_tokens=1, **GREEDY)
    assert first.usage is not None and again.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 12
    stream = list(client.completions.create(prompt=prompt, max_tokens=1, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    usage = stream[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 12


def test_stop_strings(client: openai.OpenAI) -> None:
    full = client.completions.create(prompt=PROMPT, max_tokens=6, **GREEDY).choices[0].text
    stop = full.split()[2]
    want = full[:full.index(stop)]
    r = client.completions.create(prompt=PROMPT, max_tokens=6, stop=[stop, "w99"], **GREEDY)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens < 6
    chunks = list(client.completions.create(prompt=PROMPT, max_tokens=6, stop=stop,
                                            stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_choices(client: openai.OpenAI) -> None:
    sampled: dict[str, Any] = {"model": SERVED, "temperature": 1.0, "seed": 7,
                               "extra_body": {"ignore_eos": True}}
    r = client.completions.create(prompt=PROMPT, n=2, max_tokens=4, **sampled)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage is not None and r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens == len(PROMPT)
    # choice j samples with seed + j
    second = client.completions.create(prompt=PROMPT, max_tokens=4,
                                       **{**sampled, "seed": 8})
    assert r.choices[1].text == second.choices[0].text
    stream = list(client.chat.completions.create(messages=MESSAGES, n=2, max_tokens=3,
                                                 stream=True, **sampled))
    finished = {c.choices[0].index: c.choices[0].finish_reason for c in stream
                if c.choices[0].finish_reason}
    assert finished == {0: "length", 1: "length"}


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
REFUSED: list[tuple[str, dict[str, Any], str | None, str]] = [
    ("completions", {"logprobs": 2}, "logprobs", "log probabilities"),
    ("completions", {"echo": True}, "echo", "echo"),
    ("completions", {"best_of": 3}, "best_of", "best_of"),
    ("completions", {"suffix": "w9"}, "suffix", "suffix"),
    ("completions", {"presence_penalty": 0.5}, "presence_penalty", "penalties"),
    ("completions", {"logit_bias": {"50": 1}}, "logit_bias", "logit_bias"),
    ("completions", {"n": 0}, "n", "n"),
    ("completions", {"temperature": -1}, "temperature", "temperature"),
    ("completions", {"stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ("completions", {"extra_body": {"top_k": 5}}, "top_k", "Unrecognized request argument"),
    ("completions", {"prompt": [1000, 2]}, None, "prompt token ids must be in [0, 97)"),
    ("completions", {"prompt": [1000, 2], "stream": True}, None, "must be in [0, 97)"),
    ("chat", {"logprobs": True}, "logprobs", "log probabilities"),
    ("chat", {"tools": [TOOL]}, "tools", "tool calls"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format", "text"),
    ("chat", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "messages",
     "'image_url'"),
]


@pytest.mark.parametrize(("route", "params", "param", "says"), REFUSED,
                         ids=[f"{r}-{next(iter(p))}" + ("-stream" if "stream" in p else "")
                              for r, p, _, _ in REFUSED])
def test_refused_parameters_are_400(client: openai.OpenAI, route: str, params: dict[str, Any],
                                    param: str | None, says: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        if route == "chat":
            client.chat.completions.create(**{"model": SERVED, "messages": MESSAGES,
                                              "max_tokens": 2, **params})
        else:
            client.completions.create(**{"model": SERVED, "prompt": PROMPT, "max_tokens": 2,
                                         **params})
    assert e.value.param == param and e.value.type == "invalid_request_error"
    assert says in e.value.message
    assert set(e.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]


def test_without_a_tokenizer_text_is_refused(router_url: str) -> None:
    worker = httpx.get(f"{router_url}/stats").json()["workers"]
    router = ThreadServer(router_app(Router(list(worker)))).start()
    try:
        bare = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
        name = bare.models.list().data[0].id  # the served name: the model folder's
        assert name.startswith("gqa")
        for call, param in [
                (lambda: bare.chat.completions.create(model=name, messages=MESSAGES),
                 "messages"),
                (lambda: bare.completions.create(model=name, prompt="w10"), "prompt"),
                (lambda: bare.completions.create(model=name, prompt=PROMPT, stop="w10"),
                 "stop")]:
            with pytest.raises(openai.BadRequestError) as e:
                call()
            assert e.value.param == param and "--tokenizer" in e.value.message
        # token ids still work, without text
        r = bare.completions.create(prompt=PROMPT, max_tokens=2, **{**GREEDY, "model": name})
        ids = r.choices[0].model_extra["token_ids"]  # type: ignore[index]
        assert r.choices[0].text == "" and len(ids) == 2
    finally:
        router.stop()
