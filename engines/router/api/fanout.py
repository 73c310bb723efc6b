"""The choices of one request running concurrently (:class:`Fanout`), what their failures
mean to the client (:func:`api_error`), and the SSE body of a streamed answer
(:func:`events`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx

from engines.router.api import choices as gen
from engines.router.api.choices import Choice, Delta
from engines.router.api.errors import APIError
from engines.router.api.formats import Format
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


def sse(text: str) -> str:
    """One server-sent event carrying the JSON ``text``."""
    return f"data: {text}\n\n"


class Fanout:
    """Choices running concurrently, their deltas merged in arrival order, until
    ``deadline`` (the event loop's clock)."""

    def __init__(self, router: Router, choices: list[Choice], deadline: float,
                 timeout_s: float) -> None:
        self.deadline, self.timeout_s = deadline, timeout_s
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
        error of any choice (as an :class:`APIError`), and a 504 past the deadline."""
        while self.running:
            try:
                async with asyncio.timeout_at(self.deadline):
                    item = await self.queue.get()
            except TimeoutError:
                raise APIError(504, f"the request ran past the router's limit of "
                                    f"{self.timeout_s:g} s (--request-timeout); its "
                                    "generations were cancelled") from None
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


async def events(fan: Fanout, first: list[Delta], choices: list[Choice],
                 fmt: Format) -> AsyncIterator[str]:
    """The SSE body: the deltas already received, the rest as they come, usage if asked,
    ``[DONE]``. A choice that fails now can only be reported inside the stream."""
    try:
        for d in first:
            if (chunk := fmt.chunk(d)) is not None:
                yield sse(chunk.text())
        while True:
            try:
                delta = await fan.next()
            except APIError as exc:
                yield sse(json.dumps(exc.body()))
                break
            if delta is None:
                if fmt.include_usage:
                    yield sse(fmt.usage_chunk(gen.usage(choices)).text())
                break
            if (chunk := fmt.chunk(delta)) is not None:
                yield sse(chunk.text())
        yield "data: [DONE]\n\n"
    finally:
        fan.cancel()
