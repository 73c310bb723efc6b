"""The ``/v1`` routes: ``POST /v1/completions`` (token-id or, with a tokenizer, text prompts),
``POST /v1/chat/completions`` (with a tokenizer: its chat template), ``GET /v1/models``.

A request becomes choices (each prompt times ``n``; choice ``j`` samples with ``seed + j``),
which run concurrently through :meth:`Router.stream`, each to its own worker. Without
``stream`` the answer waits for every choice. With ``stream``, the answer starts once every
choice has its first token, so that a request the workers refuse is still a plain 400 (or 503)
that clients raise, not an error inside a 200 stream; chunks then follow in arrival order,
the usage chunk when ``stream_options.include_usage`` asks for it, then ``data: [DONE]``.
A tokenizer's end-of-sequence token stops generation (unless ``ignore_eos``), as the model's
own does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from engines.router.api import choices as gen
from engines.router.api.choices import Choice, Delta
from engines.router.api.errors import APIError
from engines.router.api.formats import ChatFormat, CompletionFormat, Format
from engines.router.api.schemas import ChatRequest, CompletionRequest, Sampling
from engines.router.api.tokenizer import Tokenizer
from engines.router.core import NoWorker, Router

RETRY_AFTER = {"Retry-After": "1"}


def api_error(exc: BaseException) -> APIError:
    """What the router or a worker raised, as the client should see it."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, NoWorker):
        return APIError(503, str(exc), headers=RETRY_AFTER)
    if isinstance(exc, httpx.HTTPStatusError):  # the worker refused the request: pass it on
        status = exc.response.status_code
        return APIError(400 if status == 422 else status, worker_message(exc))
    if isinstance(exc, httpx.HTTPError | RuntimeError):  # a worker failed after its first token
        return APIError(502, f"the worker failed mid-generation: {exc}")
    raise exc


def worker_message(exc: httpx.HTTPStatusError) -> str:
    """What the worker said about a request it refused: its ``detail`` (a message, or
    FastAPI's list of validation errors), else its body as text."""
    try:
        doc = exc.response.json()
    except ValueError:
        return exc.response.text
    detail = doc["detail"] if isinstance(doc, dict) and "detail" in doc else doc
    return detail if isinstance(detail, str) else json.dumps(detail)


def sse(doc: dict[str, Any]) -> str:
    return f"data: {json.dumps(doc)}\n\n"


class Fanout:
    """Choices running concurrently, their deltas merged in arrival order."""

    def __init__(self, router: Router, choices: list[Choice]) -> None:
        self.queue: asyncio.Queue[Delta | Exception | None] = asyncio.Queue()
        self.running = len(choices)
        self.tasks = [asyncio.create_task(self._pump(router, c)) for c in choices]

    async def _pump(self, router: Router, choice: Choice) -> None:
        try:
            async for delta in gen.run(router, choice):
                self.queue.put_nowait(delta)
        except Exception as exc:
            self.queue.put_nowait(exc)
        finally:
            self.queue.put_nowait(None)

    async def next(self) -> Delta | None:
        """The next delta of any choice; None when all have finished. Raises the first
        error of any choice (as an :class:`APIError`)."""
        while self.running:
            item = await self.queue.get()
            if item is None:
                self.running -= 1
            elif isinstance(item, Exception):
                raise api_error(item)
            else:
                return item
        return None

    def cancel(self) -> None:
        """Stop every choice still running (their workers' streams are closed)."""
        for t in self.tasks:
            t.cancel()


class Service:
    """What the ``/v1`` routes do, over one router and its tokenizer (None: token ids only)."""

    def __init__(self, router: Router, tokenizer: Tokenizer | None,
                 served_model_name: str | None = None) -> None:
        self.router, self.tokenizer = router, tokenizer
        self.served_model_name = served_model_name
        self.started = int(time.time())

    def served(self) -> str:
        """The model name clients use: ``--served-model-name``, else the workers' model
        folder name (503 until a worker has answered)."""
        name = self.served_model_name or self.router.model_id
        if not name:
            try:
                self.router.check_ready()
            except NoWorker as exc:
                raise api_error(exc) from None
        return name or self.router.model_id

    def check_model(self, requested: str | None) -> str:
        """The served name; a 404 when ``requested`` is another."""
        name = self.served()
        if requested is not None and requested != name:
            raise APIError(404, f"The model `{requested}` does not exist; this router serves "
                                f"`{name}`.", param="model", code="model_not_found")
        return name

    def model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.started, "owned_by": "kvstore"}

    def need_tokenizer(self, what: str, param: str) -> Tokenizer:
        if self.tokenizer is None:
            raise APIError(400, f"{what} need the router's --tokenizer (a Hugging Face "
                                "tokenizer folder); without one, send token ids", param=param)
        return self.tokenizer

    def completion_prompts(self, prompt: Any) -> list[list[int]]:
        """Token ids of each prompt of a completion request (text through the tokenizer)."""
        batch = [prompt] if isinstance(prompt, str) else list(prompt)
        if batch and isinstance(batch[0], int):
            batch = [batch]
        elif batch and isinstance(batch[0], str):
            tok = self.need_tokenizer("text prompts", "prompt")
            batch = [tok.encode(s) for s in batch]
        if not batch or any(not p for p in batch):
            raise APIError(400, "prompt must not be empty", param="prompt")
        return cast(list[list[int]], batch)

    def chat_prompt(self, req: ChatRequest) -> list[int]:
        tok = self.need_tokenizer("chat completions", "messages")
        return tok.encode_chat([m.as_template_input() for m in req.messages])

    def choices(self, req: CompletionRequest | ChatRequest,
                prompts: list[list[int]]) -> list[Choice]:
        """Each prompt times ``n``, with the worker's body of each."""
        stops = req.stop_strings()
        if stops:
            self.need_tokenizer("stop strings", "stop")
        stop_ids = list(req.stop_token_ids)
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        if eos is not None and not req.ignore_eos and eos not in stop_ids:
            stop_ids.append(eos)
        out = []
        for i, prompt in enumerate(prompts):
            budget = req.output_budget(len(prompt), self.router.max_model_len)
            for j in range(req.n):
                body = {"prompt_ids": prompt, "max_tokens": budget,
                        "temperature": req.temperature, "top_p": req.top_p,
                        "seed": None if req.seed is None else req.seed + j,
                        "ignore_eos": req.ignore_eos, "stop_token_ids": stop_ids}
                if req.user is not None:  # the session key of affinity routing
                    body["session"] = req.user
                decoder = self.tokenizer.decoder(prompt) if self.tokenizer is not None else None
                out.append(Choice(i * req.n + j, i, prompt, body, decoder, stops))
        return out

    async def answer(self, req: Sampling, choices: list[Choice], fmt: Format) -> Any:
        """Run ``choices``: the whole response, or (``stream``) an SSE response that starts
        once every choice has its first token."""
        fan = Fanout(self.router, choices)
        first: list[Delta] = []
        try:
            if not req.stream:
                while await fan.next() is not None:
                    pass  # each choice keeps its own text and tokens
                return fmt.response(choices, gen.usage(choices))
            seen: set[int] = set()
            while len(seen) < len(choices) and (d := await fan.next()) is not None:
                first.append(d)
                seen.add(d.index)
        except BaseException:
            fan.cancel()
            raise
        return StreamingResponse(events(fan, first, choices, fmt),
                                 media_type="text/event-stream")


async def events(fan: Fanout, first: list[Delta], choices: list[Choice],
                 fmt: Format) -> AsyncIterator[str]:
    """The SSE body: the deltas already received, the rest as they come, usage if asked,
    ``[DONE]``. A choice that fails now can only be reported inside the stream."""
    try:
        for d in first:
            if (doc := fmt.chunk(d)) is not None:
                yield sse(doc)
        while True:
            try:
                delta = await fan.next()
            except APIError as exc:
                yield sse(exc.body())
                break
            if delta is None:
                if fmt.include_usage:
                    yield sse(fmt.usage_chunk(gen.usage(choices)))
                break
            if (doc := fmt.chunk(delta)) is not None:
                yield sse(doc)
        yield "data: [DONE]\n\n"
    finally:
        fan.cancel()


def make_routes(router: Router, tokenizer: Tokenizer | None,
                served_model_name: str | None = None) -> APIRouter:
    api = APIRouter(prefix="/v1")
    svc = Service(router, tokenizer, served_model_name)

    @api.post("/completions")
    async def completions(req: CompletionRequest) -> Any:
        req.refuse_unsupported()
        model = svc.check_model(req.model)
        choices = svc.choices(req, svc.completion_prompts(req.prompt))
        return await svc.answer(req, choices, CompletionFormat(model, req.include_usage))

    @api.post("/chat/completions")
    async def chat_completions(req: ChatRequest) -> Any:
        req.refuse_unsupported()
        model = svc.check_model(req.model)
        choices = svc.choices(req, [svc.chat_prompt(req)])
        return await svc.answer(req, choices, ChatFormat(model, req.include_usage))

    @api.get("/models")
    async def models() -> dict[str, Any]:
        name = svc.served_model_name or router.model_id
        return {"object": "list", "data": [svc.model_card(name)] if name else []}

    @api.get("/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        return svc.model_card(svc.check_model(model))

    return api
