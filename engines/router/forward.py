"""Forwarding a generation to one worker over HTTP, plain or streamed, and what the worker's
answer means: served, failed (connection refused, 5xx: the router asks the worker's ``/health``
whether the worker or only the request failed), switched to another role (409 with
``x-kvstore-role``: relearn it, try another) or a bad request (4xx: every worker would refuse
it, so the caller gets the error, and it is not retried).

Which worker, and what to do after a failure, is the router's business
(:class:`engines.router.core.Router`); these functions only talk to the one they are given,
in the worker's own messages (:mod:`engines.messages`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Generic, NamedTuple, TypeVar

import httpx
from pydantic import ValidationError

from engines.messages import (
    FirstToken,
    GenerateReply,
    GenerateRequest,
    StreamError,
    Token,
    read_event,
)
from engines.worker_control import ROLE_HEADER

FAILURES = (httpx.TransportError,)  # a worker that could not be reached at all
HEALTH_TIMEOUT_S = 5.0  # a busy worker still answers /health (an async route) well within it
JSON = {"content-type": "application/json"}

Streamed = FirstToken | Token | GenerateReply  # what a stream yields (an error event raises)
_M = TypeVar("_M")


class Routed(NamedTuple, Generic[_M]):
    """A worker's message and the worker (its URL) that sent it."""

    worker: str
    message: _M


class WorkerDown(Exception):
    """The worker could not serve the request (connection refused, 5xx): down, unless its
    ``/health`` says otherwise (then :class:`RequestFailed`)."""


class RequestFailed(RuntimeError):
    """A healthy worker failed this one request (a 5xx, its ``/health`` still 200): the
    request fails with the worker's message and is not tried elsewhere (where it would most
    likely fail again), and the worker stays up."""


class WrongRole(WorkerDown):
    """The worker's role changed since the request was planned (409 with ``x-kvstore-role``):
    the router relearns it and tries another worker; the worker is not marked down."""


def wrong_role(r: httpx.Response) -> bool:
    """Whether ``r`` is a worker refusing a request meant for another role."""
    return r.status_code == 409 and ROLE_HEADER in r.headers


async def healthy(client: httpx.AsyncClient, url: str) -> bool:
    """Whether the worker at ``url`` answers ``GET /health`` with 200."""
    try:
        r = await client.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


async def generate(client: httpx.AsyncClient, url: str, req: GenerateRequest) -> GenerateReply:
    """``POST {url}/generate``: the worker's reply. Raises :class:`WorkerDown` on a 5xx or an
    answer that is not a reply, :class:`WrongRole` on a role refusal and
    ``httpx.HTTPStatusError`` on another 4xx."""
    r = await client.post(f"{url}/generate", content=req.wire(), headers=JSON)
    if r.status_code >= 500:
        raise WorkerDown(f"{url}: {r.status_code} {r.text[:200]}")
    if wrong_role(r):
        raise WrongRole(f"{url} is now {r.headers[ROLE_HEADER]}")
    r.raise_for_status()  # 4xx: the request is bad, another worker would refuse it too
    try:
        return GenerateReply.model_validate_json(r.content)
    except ValidationError as exc:
        raise WorkerDown(f"{url} answered /generate with no reply: {exc}") from None


async def stream(client: httpx.AsyncClient, url: str,
                 req: GenerateRequest) -> AsyncGenerator[Streamed, None]:
    """``POST {url}/generate`` streamed: yields the worker's events (a :class:`FirstToken`,
    then a :class:`Token` per token, then the :class:`GenerateReply`). Raises as
    :func:`generate` before the stream starts; an error event (or one that is no event)
    raises :class:`WorkerDown` before the first token (another worker may serve it) and
    ``RuntimeError`` after it (tokens already went to the client). Close it (``aclosing``)
    to give the connection back when the caller stops reading early."""
    started = False
    body = req.model_copy(update={"stream": True}).wire()
    async with client.stream("POST", f"{url}/generate", content=body, headers=JSON) as r:
        if r.status_code >= 500:
            raise WorkerDown(f"{url}: {r.status_code}")
        if wrong_role(r):
            raise WrongRole(f"{url} is now {r.headers[ROLE_HEADER]}")
        if r.status_code >= 400:
            await r.aread()
            raise httpx.HTTPStatusError(r.text, request=r.request, response=r)
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                event = read_event(line[6:])
            except ValueError as exc:
                event = StreamError(error=f"{url} sent no generate event: {exc}")
            if isinstance(event, StreamError):
                if started:  # tokens already went to the client: cannot retry
                    raise RuntimeError(event.error)
                raise WorkerDown(event.error)
            started = started or not isinstance(event, GenerateReply)
            yield event
