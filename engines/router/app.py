"""The router's HTTP face: OpenAI-compatible ``POST /v1/completions`` (token-id prompts, or
text when a tokenizer folder is given; ``stream: true`` answers with server-sent events),
``GET /v1/models``, ``GET /stats``, ``GET /health``. Translation only; routing is
:class:`engines.router.core.Router`."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from engines.router.core import NoWorker, Router


def unavailable(exc: NoWorker) -> HTTPException:
    return HTTPException(503, str(exc), headers={"Retry-After": "1"})


def worker_error(exc: httpx.HTTPStatusError) -> Any:
    """What the worker said about a request it refused: its ``detail`` (a message, or
    FastAPI's list of validation errors), else its body as text."""
    try:
        doc = exc.response.json()
    except ValueError:
        return exc.response.text
    return doc["detail"] if isinstance(doc, dict) and "detail" in doc else doc


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)  # OpenAI's default; 0 is greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stream: bool = False
    ignore_eos: bool = False  # vLLM's extension
    stop_token_ids: list[int] = []  # vLLM's extension


def create_app(router: Router, tokenizer_dir: str | None = None) -> FastAPI:
    tokenizer: Any = None
    if tokenizer_dir:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await router.start()
        yield
        await router.close()

    app = FastAPI(title="kvstore router", lifespan=lifespan)

    def prompts(req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            p = [p]
        if p and isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        if p and isinstance(p[0], str):
            if tokenizer is None:
                raise HTTPException(400, "text prompts need the router's --tokenizer")
            return [tokenizer.encode(s) for s in p]  # type: ignore[union-attr]
        if not p or any(not x for x in p):
            raise HTTPException(400, "prompt must not be empty")
        return p  # type: ignore[return-value]

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids) if tokenizer is not None else ""

    def worker_body(req: CompletionRequest, prompt: list[int]) -> dict[str, Any]:
        return {"prompt_ids": prompt, "max_tokens": req.max_tokens,
                "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed,
                "ignore_eos": req.ignore_eos, "stop_token_ids": req.stop_token_ids}

    async def one(req: CompletionRequest, prompt: list[int]) -> dict[str, Any]:
        try:
            return await router.generate(worker_body(req, prompt))
        except NoWorker as exc:
            raise unavailable(exc) from None
        except httpx.HTTPStatusError as exc:  # the worker refused the request: pass it on
            raise HTTPException(exc.response.status_code, worker_error(exc)) from None

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Any:
        batch = prompts(req)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        model = req.model or router.model_id
        if req.stream:
            if len(batch) != 1:
                raise HTTPException(400, "stream supports one prompt per request")
            try:
                router.check_ready()  # a 503 now, not an error event after a 200
            except NoWorker as exc:
                raise unavailable(exc) from None
            return StreamingResponse(sse(req, batch[0], cid, created, model),
                                     media_type="text/event-stream")
        docs = [await one(req, p) for p in batch]
        choices = [{"index": i, "text": text(d["token_ids"]), "token_ids": d["token_ids"],
                    "logprobs": None, "finish_reason": d["finish_reason"]}
                   for i, d in enumerate(docs)]
        prompt_tokens = sum(len(p) for p in batch)
        completion_tokens = sum(len(d["token_ids"]) for d in docs)
        return {"id": cid, "object": "text_completion", "created": created, "model": model,
                "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens,
                          "prompt_tokens_details": {
                              "cached_tokens": sum(d["cached_tokens"] for d in docs)}},
                "kvstore": [{"worker": d["worker"], "cached_tokens": d["cached_tokens"],
                             "ttft_s": d["ttft_s"]} for d in docs]}

    async def sse(req: CompletionRequest, prompt: list[int], cid: str, created: int,
                  model: str) -> AsyncIterator[str]:
        def chunk(ids: list[int], finish: str | None) -> str:
            doc = {"id": cid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text(ids), "token_ids": ids,
                                "logprobs": None, "finish_reason": finish}]}
            return f"data: {json.dumps(doc)}\n\n"

        try:
            async for ev in router.stream(worker_body(req, prompt)):
                if "token_id" in ev:
                    yield chunk([ev["token_id"]], None)
                else:
                    yield chunk([], ev["finish_reason"])
        except httpx.HTTPStatusError as exc:
            yield f"data: {json.dumps({'error': {'message': worker_error(exc)}})}\n\n"
        except (NoWorker, httpx.HTTPError, RuntimeError) as exc:
            yield f"data: {json.dumps({'error': {'message': str(exc)}})}\n\n"
        yield "data: [DONE]\n\n"

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": router.model_id, "object": "model",
                                            "owned_by": "kvstore"}]}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return router.stats()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """The router is alive; ``ready`` says whether a worker could take a request now."""
        try:
            router.check_ready()
            ready = True
        except NoWorker:
            ready = False
        return {"ok": True, "ready": ready, "workers_up": sum(w.up for w in router.workers)}

    return app
