"""Forwarding a generation to one worker over HTTP, plain or streamed, and what the worker's
answer means: served, failed (connection refused, 5xx: the router asks the worker's ``/health``
whether the worker or only the request failed), switched to another role (409 with
``x-kvstore-role``: relearn it, try another) or a bad request (4xx: every worker would refuse
it, so the caller gets the error, and it is not retried).

Which worker, and what to do after a failure, is the router's business
(:class:`engines.router.core.Router`); these functions only talk to the one they are given.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from engines.worker_control import ROLE_HEADER

FAILURES = (httpx.TransportError,)  # a worker that could not be reached at all
HEALTH_TIMEOUT_S = 5.0  # a busy worker still answers /health (an async route) well within it


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


async def generate(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """``POST {url}/generate``: the worker's document. Raises :class:`WorkerDown` on a 5xx,
    :class:`WrongRole` on a role refusal and ``httpx.HTTPStatusError`` on another 4xx."""
    r = await client.post(f"{url}/generate", json=body)
    if r.status_code >= 500:
        raise WorkerDown(f"{url}: {r.status_code} {r.text[:200]}")
    if wrong_role(r):
        raise WrongRole(f"{url} is now {r.headers[ROLE_HEADER]}")
    r.raise_for_status()  # 4xx: the request is bad, another worker would refuse it too
    doc: dict[str, Any] = r.json()
    return doc


async def stream(client: httpx.AsyncClient, url: str,
                 body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
    """``POST {url}/generate`` streamed: yields the worker's events (``{"token_id": t}``...,
    then the summary). Raises as :func:`generate` before the stream starts; an error event
    raises :class:`WorkerDown` before the first token (another worker may serve it) and
    ``RuntimeError`` after it (tokens already went to the client). Close it (``aclosing``)
    to give the connection back when the caller stops reading early."""
    started = False
    async with client.stream("POST", f"{url}/generate", json={**body, "stream": True}) as r:
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
            doc = json.loads(line[6:])
            if "error" in doc and "token_id" not in doc:
                if started:  # tokens already went to the client: cannot retry
                    raise RuntimeError(doc["error"])
                raise WorkerDown(doc["error"])
            started = started or "token_id" in doc
            yield doc
