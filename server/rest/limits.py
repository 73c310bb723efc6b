"""ASGI middleware that bounds request bodies: a limit per route, sized to what the route can
use, and a budget of body bytes in flight over all requests together.

A body whose Content-Length is over its route's limit is answered 413 before it is read; a
chunked body is answered 413 as soon as it crosses the limit. A request whose body would take
the server past its budget is answered 503 (``Retry-After: 1``), unless it is larger than the
whole budget, which no retry can help: that is a 413 too. Both answers name the limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException

from server.auth import Principal
from server.rest.explain_schemas import MAX_EXPLAIN_TOKENS, MAX_MM_INPUTS
from server.rest.gate import PRINCIPAL, send_error

Scope = dict[str, Any]
Message = dict[str, Any]

# JSON bytes per hash in a lookup or prefetch body: up to 128 hex digits, quotes, ", "
JSON_BYTES_PER_HASH = 132
JSON_OVERHEAD_BYTES = 64 << 10  # the namespace name, keys, whitespace
NAMESPACE_BODY_BYTES = 1 << 20  # a namespace registration
OTHER_BODY_BYTES = 1 << 20  # any other route (most take no body at all)
# an explain: up to 10 digits and ", " per token, up to 2 KiB per multimodal input (a 256-
# character identifier, JSON-escaped), the salt and the LoRA's name and path
EXPLAIN_BODY_BYTES = 12 * MAX_EXPLAIN_TOKENS + (2 << 10) * MAX_MM_INPUTS + JSON_OVERHEAD_BYTES
_BLOCK_PUT = re.compile(r"^/v1/blocks/([^/]+)/[^/]+$")


class BodyRefused(HTTPException):
    """Raised from ``receive`` when a chunked body crosses its limit or the budget. An
    ``HTTPException``, so that FastAPI's body parsing lets it through unchanged (it turns
    other exceptions into a 400) and the app's handler answers it."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(status, message, {"Connection": "close"})
        self.code = code


def too_large(limit: int, what: str) -> BodyRefused:
    return BodyRefused(413, "too_large", f"request body exceeds the {limit}-byte limit {what}")


def over_budget(budget: int) -> BodyRefused:
    return BodyRefused(503, "busy", f"request bodies in flight would exceed the server's "
                                    f"{budget}-byte budget (rest_body_budget_bytes); retry "
                                    "shortly")


class RouteLimits:
    """The body limit of a request: ``max_request_bytes`` at most, less where the route can
    use less (a block PUT: its namespace's block size; a lookup: ``max_batch`` hashes)."""

    def __init__(self, max_request_bytes: int, max_batch: int,
                 block_bytes: Callable[[str, Principal], int | None]) -> None:
        self.max_request_bytes = max_request_bytes
        self.hashes_bytes = max_batch * JSON_BYTES_PER_HASH + JSON_OVERHEAD_BYTES
        # the block size of the namespace the caller calls so; None for one unknown to it
        # (the route says 404): never another tenant's, whose size would tell it exists
        self.block_bytes = block_bytes

    def __call__(self, method: str, path: str,
                 principal: Principal | None = None) -> tuple[int, str]:
        """The limit and the words that explain it (``principal``: the caller, if known)."""
        limit, what = OTHER_BODY_BYTES, f"of {method} {path}"
        if method == "POST" and path in ("/v1/lookup", "/v1/prefetch"):
            limit, what = self.hashes_bytes, "of a lookup or prefetch (max_batch hashes)"
        elif method == "POST" and path == "/v1/explain":
            limit, what = EXPLAIN_BODY_BYTES, "of an explain (its token and input limits)"
        elif method == "POST" and path == "/v1/namespaces":
            limit, what = NAMESPACE_BODY_BYTES, "of a namespace registration"
        elif method == "PUT" and (match := _BLOCK_PUT.match(path)):
            size = None if principal is None else self.block_bytes(match.group(1), principal)
            limit, what = self.max_request_bytes, "(max_request_bytes)"
            if size is not None and size < limit:
                limit, what = size, f"of a block of namespace {match.group(1)!r}"
        if self.max_request_bytes < limit:
            limit, what = self.max_request_bytes, "(max_request_bytes)"
        return limit, what


class BodyBudget:
    """Body bytes in flight over every request; event-loop confined (no lock)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return max(int(value), 0)
            except ValueError:
                return None  # the HTTP parser refuses it before we run
    return None


class BodyLimitMiddleware:
    def __init__(self, app: Any, limits: RouteLimits, budget: BodyBudget) -> None:
        self.app = app
        self.limits = limits
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, what = self.limits(scope["method"], scope["path"], scope.get(PRINCIPAL))
        if self.budget.total < limit:  # larger than every body in flight may be together:
            limit, what = self.budget.total, f"{what}, capped by rest_body_budget_bytes"
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(send, too_large(limit, what))
            return
        held = declared or 0  # a declared body is reserved whole; a chunked one as it comes
        if not self.budget.take(held):
            await self._refuse(send, over_budget(self.budget.total))
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, held
            message: Message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(limit, what)
                if seen > held:
                    if not self.budget.take(seen - held):
                        raise over_budget(self.budget.total)
                    held = seen
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyRefused as exc:  # raised where no handler of the app answered it
            if not started:
                await self._refuse(send, exc)
        finally:
            self.budget.give(held)

    @staticmethod
    async def _refuse(send: Any, exc: BodyRefused) -> None:
        headers = [(b"retry-after", b"1")] if exc.status_code == 503 else []
        await send_error(send, exc.status_code, exc.code, str(exc.detail), headers)
