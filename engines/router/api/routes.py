"""The ``/v1`` routes: ``POST /v1/completions`` (token-id or, with a tokenizer, text prompts),
``POST /v1/chat/completions`` (with a tokenizer: its chat template), ``GET /v1/models``.

A request becomes choices (each prompt times ``n``; choice ``j`` samples with ``seed + j``),
which run concurrently through :meth:`Router.stream`, each to its own worker. Without
``stream`` the answer waits for every choice. With ``stream``, the answer starts once every
choice has its first token, so that a request the workers refuse is still a plain 400 (or 503)
that clients raise, not an error inside a 200 stream; chunks then follow in arrival order,
the usage chunk when ``stream_options.include_usage`` asks for it, then ``data: [DONE]``.
A tokenizer's end-of-sequence token stops generation (unless ``ignore_eos``), as the model's
own does. Each request is held to the router's :class:`~engines.router.api.limits.Limits`:
its choices (prompts times ``n``) are counted before any text is tokenized, text is tokenized
in a thread, each prompt is checked against the model's context before any worker is asked,
and its choices run until the request's deadline (:class:`~engines.router.api.fanout.Fanout`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from engines.messages import GenerateRequest
from engines.router.api import choices as gen
from engines.router.api.choices import Choice, Delta
from engines.router.api.documents import ModelCard, ModelList
from engines.router.api.errors import APIError
from engines.router.api.fanout import Fanout, api_error, events
from engines.router.api.formats import ChatFormat, CompletionFormat, Format
from engines.router.api.limits import Limits
from engines.router.api.schemas import ChatRequest, CompletionRequest, Sampling
from engines.router.api.stops import StopMatcher, StopSet
from engines.router.api.tokenizer import Tokenizer
from engines.router.core import NoWorker, Router

TOKENIZE_AT_ONCE = 2  # requests tokenizing at the same time (each in a thread)
_T = TypeVar("_T")


class Service:
    """What the ``/v1`` routes do, over one router and its tokenizer (None: token ids only)."""

    def __init__(self, router: Router, tokenizer: Tokenizer | None,
                 served_model_name: str | None = None, limits: Limits | None = None) -> None:
        self.router, self.tokenizer = router, tokenizer
        self.served_model_name = served_model_name
        self.limits = limits or Limits()
        self.started = int(time.time())
        # tokenizing holds memory in proportion to the text: a few at a time
        self.tokenizing = asyncio.Semaphore(TOKENIZE_AT_ONCE)

    def deadline(self) -> float:
        """A request's deadline, on the event loop's clock, from now."""
        return asyncio.get_running_loop().time() + self.limits.request_timeout_s

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

    def model_card(self, name: str) -> ModelCard:
        return ModelCard(id=name, object="model", created=self.started, owned_by="kvstore")

    def need_tokenizer(self, what: str, param: str) -> Tokenizer:
        if self.tokenizer is None:
            raise APIError(400, f"{what} need the router's --tokenizer (a Hugging Face "
                                "tokenizer folder); without one, send token ids", param=param)
        return self.tokenizer

    async def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        """Token ids of each prompt of a completion request (text through the tokenizer,
        in a thread), once their number is known to be within the choices cap."""
        prompt = req.prompt
        batch: list[Any] = [prompt] if isinstance(prompt, str) else list(prompt)
        if batch and isinstance(batch[0], int):
            batch = [batch]
        self.check_choices(len(batch), req.n)
        if batch and isinstance(batch[0], str):
            tok = self.need_tokenizer("text prompts", "prompt")
            texts = cast(list[str], batch)
            return self.non_empty(await self.tokenize(lambda: [tok.encode(s) for s in texts]))
        return self.non_empty(cast(list[list[int]], batch))

    @staticmethod
    def non_empty(prompts: list[list[int]]) -> list[list[int]]:
        if not prompts or any(not p for p in prompts):
            raise APIError(400, "prompt must not be empty", param="prompt")
        return prompts

    async def chat_prompt(self, req: ChatRequest) -> list[int]:
        tok = self.need_tokenizer("chat completions", "messages")
        self.check_choices(1, req.n)
        messages = [m.as_template_input() for m in req.messages]
        return await self.tokenize(lambda: tok.encode_chat(messages))

    async def tokenize(self, work: Callable[[], _T]) -> _T:
        """``work`` (tokenizing) in a thread: a large text must not stall the event loop."""
        async with self.tokenizing:
            return await asyncio.to_thread(work)

    def check_choices(self, prompts: int, n: int) -> None:
        cap = self.limits.max_choices
        if prompts * n > cap:
            raise APIError(400, f"{prompts} prompts x n={n} is {prompts * n} choices; the "
                                f"router serves at most {cap} per request (--max-choices)",
                           param="n" if n > 1 else "prompt")

    def check_lengths(self, req: CompletionRequest | ChatRequest,
                      prompts: list[list[int]]) -> list[int]:
        """Each prompt's output budget, after checking each prompt against the prompt cap
        and, with its budget, against the model's context (400s that say by how much)."""
        cap = self.limits.prompt_tokens(self.router.max_model_len)
        context = self.router.max_model_len
        param = "messages" if isinstance(req, ChatRequest) else "prompt"
        budgets = []
        for i, prompt in enumerate(prompts):
            which = f"prompt {i}" if len(prompts) > 1 else "the prompt"
            if cap is not None and len(prompt) > cap:
                raise APIError(400, f"{which} has {len(prompt)} tokens; at most {cap} are "
                                    f"served (the model's context is {context or '?'} "
                                    "tokens)", param=param, code="context_length_exceeded")
            budget = req.output_budget(len(prompt), context)
            if context and len(prompt) + budget > context:
                raise APIError(400, f"This model's maximum context length is {context} "
                                    f"tokens. However, you requested {len(prompt) + budget} "
                                    f"tokens ({len(prompt)} in {which}, {budget} in the "
                                    "completion).", param="max_tokens",
                               code="context_length_exceeded")
            budgets.append(budget)
        return budgets

    def choices(self, req: CompletionRequest | ChatRequest,
                prompts: list[list[int]]) -> list[Choice]:
        """Each prompt times ``n``, with what its worker is asked (``user`` is the session
        key of affinity routing)."""
        stops = req.stop_strings()
        if stops:
            self.need_tokenizer("stop strings", "stop")
        stop_set = StopSet(stops) if stops else None  # built once, shared by the choices
        stop_ids = list(req.stop_token_ids)
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        if eos is not None and not req.ignore_eos and eos not in stop_ids:
            stop_ids.append(eos)
        temperature, top_p = req.sampling()
        out = []
        for i, (prompt, budget) in enumerate(zip(prompts, self.check_lengths(req, prompts),
                                                 strict=True)):
            for j in range(req.n):
                ask = GenerateRequest(prompt_ids=prompt, max_tokens=budget,
                                      temperature=temperature, top_p=top_p,
                                      seed=None if req.seed is None else req.seed + j,
                                      ignore_eos=req.ignore_eos, stop_token_ids=stop_ids)
                if req.cache_salt is not None:  # hashed into the prompt's first block
                    ask = ask.model_copy(update={"cache_salt": req.cache_salt})
                decoder = self.tokenizer.decoder(prompt) if self.tokenizer is not None else None
                matcher = StopMatcher(stop_set) if stop_set is not None else None
                out.append(Choice(i * req.n + j, i, prompt, ask, decoder, matcher,
                                  session=req.user))
        return out

    async def answer(self, req: Sampling, choices: list[Choice], fmt: Format,
                     deadline: float) -> Any:
        """Run ``choices`` until ``deadline``: the whole response, or (``stream``) an SSE
        response that starts once every choice has its first token."""
        fan = Fanout(self.router, choices, deadline, self.limits.request_timeout_s)
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


def make_routes(router: Router, tokenizer: Tokenizer | None,
                served_model_name: str | None = None, limits: Limits | None = None) -> APIRouter:
    api = APIRouter(prefix="/v1")
    svc = Service(router, tokenizer, served_model_name, limits)

    @api.post("/completions")
    async def completions(req: CompletionRequest) -> Any:
        deadline = svc.deadline()
        req.refuse_unsupported()
        model = svc.check_model(req.model)
        choices = svc.choices(req, await svc.completion_prompts(req))
        return await svc.answer(req, choices, CompletionFormat(model, req.include_usage),
                                deadline)

    @api.post("/chat/completions")
    async def chat_completions(req: ChatRequest) -> Any:
        deadline = svc.deadline()
        req.refuse_unsupported()
        model = svc.check_model(req.model)
        choices = svc.choices(req, [await svc.chat_prompt(req)])
        return await svc.answer(req, choices, ChatFormat(model, req.include_usage), deadline)

    @api.get("/models")
    async def models() -> ModelList:
        name = svc.served_model_name or router.model_id
        return ModelList(object="list", data=[svc.model_card(name)] if name else [])

    @api.get("/models/{model:path}")
    async def model(model: str) -> ModelCard:
        return svc.model_card(svc.check_model(model))

    return api
