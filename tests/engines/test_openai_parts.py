"""The router's OpenAI API without workers: stop strings held back and cut, usage over
choices, the documents of a stream's chunks, and errors (validation, refusals, internal) in
OpenAI's shape only under ``/v1``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engines.messages import PrefixHit
from engines.router.api.choices import Choice, Delta, usage
from engines.router.api.formats import ChatFormat, CompletionFormat
from engines.router.api.stops import StopMatcher, StopSet
from engines.router.app import create_app
from engines.router.core import Routed, Router


class Pieces:
    """A decoder stand-in: token ``t`` decodes to ``pieces[t]``."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def push(self, token: int) -> str:
        return self.pieces[token]


def choice(pieces: list[str], stops: tuple[str, ...], index: int = 0, prompt: int = 0,
           cached: int = 0) -> Choice:
    matcher = StopMatcher(StopSet(stops)) if stops else None
    c = Choice(index, prompt, [1, 2, 3], {}, Pieces(pieces), matcher)  # type: ignore[arg-type]
    c.cached_tokens = cached
    return c


def test_a_stop_string_across_tokens_is_cut_and_never_sent() -> None:
    c = choice(["Hel", "lo", " wor", "ld"], ("o w",))
    sent = [c.push(0), c.push(1), c.push(2)]
    assert [d.text for d in sent] == ["Hel", "l", ""]  # "o" waited: it may begin "o w"
    assert sent[-1].finish_reason == "stop" and c.finish_reason == "stop"
    assert c.text == "Hell" and c.token_ids == [0, 1, 2]


def test_held_text_is_sent_when_it_turns_out_not_to_stop() -> None:
    c = choice(["ab", "c", "x", "c"], ("cd",))
    assert [c.push(t).text for t in (0, 1, 2, 3)] == ["ab", "", "cx", ""]
    last = c.finish("length")
    assert (last.text, last.finish_reason, c.text) == ("c", "length", "abcxc")


def test_without_stops_text_goes_out_at_once() -> None:
    c = choice(["a", "b"], ())
    assert [c.push(0).text, c.push(1).text, c.finish("length").text] == ["a", "b", ""]


def test_usage_counts_a_prompt_once_with_its_least_cached_choice() -> None:
    cs = [choice(["a"], (), 0, 0, cached=8), choice(["a"], (), 1, 0, cached=4),
          choice(["a"], (), 2, 1, cached=0)]
    for c in cs:
        c.push(0)
    assert usage(cs).model_dump() == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9,
                         "prompt_tokens_details": {"cached_tokens": 4}}


@pytest.fixture
def app_client(monkeypatch: pytest.MonkeyPatch) -> Any:
    router = Router(["http://127.0.0.1:1"])  # never answers: nothing is routed

    def broken(*_: Any) -> Any:
        raise KeyError("boom")

    monkeypatch.setattr(router, "stream", broken)
    with TestClient(create_app(router, served_model_name="m"),
                    raise_server_exceptions=False) as c:
        yield c


def test_errors_in_openai_shape_under_v1_only(app_client: TestClient) -> None:
    r = app_client.post("/v1/completions", json={"model": "m", "prompt": [1], "max_tokens": 0})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "max_tokens: Input should be greater than or "
                                             "equal to 1", "type": "invalid_request_error",
                                  "param": "max_tokens", "code": None}}
    r = app_client.post("/v1/completions", content=b"{not json",
                        headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = app_client.post("/v1/completions", json={"model": "other", "prompt": [1]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = app_client.post("/v1/embeddings", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = app_client.post("/v1/completions", json={"model": "m", "prompt": [1]})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "KeyError" in r.json()["error"]["message"]
    assert app_client.get("/nowhere").json() == {"detail": "Not Found"}  # FastAPI's own


def test_chunks_carry_only_what_they_have() -> None:
    """A stream's chunks as typed documents: ``kvstore`` on a choice's first token only,
    ``usage`` as null in every chunk when asked for and filled in the last, and a chat
    delta's role in its first chunk only."""
    hit = PrefixHit(prompt_tokens=3, cached_tokens=0, local_hit_tokens=0, store_hit_tokens=0,
                    ttft_s=0.5, queue_s=0.0, load_s=0.0, prefill_s=0.5)
    fmt = CompletionFormat("m", include_usage=True)
    first = fmt.chunk(Delta(0, "a", [5], None, Routed("http://w", hit)))
    assert first is not None
    head = {"id": fmt.id, "object": "text_completion", "created": fmt.created, "model": "m"}
    assert json.loads(first.text()) == {
        **head, "choices": [{"index": 0, "text": "a", "token_ids": [5], "logprobs": None,
                             "finish_reason": None}],
        "kvstore": {"index": 0, "worker": "http://w", **hit.model_dump()}, "usage": None}
    c = choice(["a"], ())
    c.push(0)
    assert json.loads(fmt.usage_chunk(usage([c])).text()) == {
        **head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                         "total_tokens": 4,
                                         "prompt_tokens_details": {"cached_tokens": 0}}}
    chat = ChatFormat("m")
    docs = [chat.chunk(Delta(0, t, [1], None)) for t in ("", "", "b")]
    assert [d and json.loads(d.text())["choices"][0]["delta"] for d in docs] == [
        {"role": "assistant", "content": ""}, None, {"content": "b"}]
    assert docs[0] is not None and "usage" not in json.loads(docs[0].text())
    whole = chat.response([c], usage([c])).model_dump()
    assert whole["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "a"},
                                 "logprobs": None, "finish_reason": None}]
    assert whole["kvstore"] == [{"worker": "", "cached_tokens": 0, "ttft_s": None}]
