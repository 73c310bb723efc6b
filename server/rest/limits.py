"""ASGI middleware that bounds request bodies: a limit per route, sized to what the route can
use, a budget of body bytes in flight over all requests together with a share of it per
tenant, and a deadline for the whole body.

A body whose Content-Length is over its route's limit is answered 413 before it is read; a
chunked body is answered 413 as soon as it crosses the limit. A request whose body would take
the server past its budget is answered 503 (``Retry-After: 1``), one that would take its
tenant past its share 429 (``Retry-After: 1``), unless it is larger than the whole budget or
share, which no retry can help: that is a 413 too. All answers name the limit.

A body not received within ``rest_body_timeout_s`` of its headers is answered 408 and its
connection closed: without the deadline, a client sending a declared 64 MiB body at one byte
every ten seconds held its share of the budget for ever, and a few such clients locked every
tenant out of every request with a body. Its budget is given back with the answer.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.auth import Principal
from server.rest.explain_schemas import MAX_EXPLAIN_TOKENS, MAX_MM_INPUTS
from server.rest.gate import PRINCIPAL, send_error

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


def over_share(tenant: str, share: int) -> BodyRefused:
    return BodyRefused(429, "busy", f"request bodies in flight of tenant {tenant!r} would "
                                    f"exceed its {share}-byte share of the body budget "
                                    "(rest_body_budget_per_tenant_bytes); retry shortly")


def body_late(timeout_s: float) -> BodyRefused:
    return BodyRefused(408, "timeout", f"request body not received within {timeout_s:g} s "
                                       "of its headers (rest_body_timeout_s)")


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
    """Body bytes in flight over every request, and per tenant; event-loop confined (no lock).
    The admin (``tenant`` None, every caller when auth is off) draws on the whole budget; a
    tenant on at most ``per_tenant`` of it (0: a quarter)."""

    def __init__(self, total: int, per_tenant: int = 0) -> None:
        self.total = total
        self.per_tenant = min(per_tenant or total // 4, total)
        self.used = 0
        self.by_tenant: dict[str, int] = {}

    def cap(self, tenant: str | None) -> tuple[int, str]:
        """The most ``tenant`` may ever hold, and the setting that says so."""
        if tenant is None:
            return self.total, "rest_body_budget_bytes"
        return self.per_tenant, "rest_body_budget_per_tenant_bytes"

    def take(self, n: int, tenant: str | None) -> BodyRefused | None:
        """Take ``n`` bytes for ``tenant``; None when they fit, else the refusal (nothing
        taken)."""
        mine = self.by_tenant.get(tenant, 0) if tenant is not None else 0
        if tenant is not None and mine + n > self.per_tenant:
            return over_share(tenant, self.per_tenant)
        if self.used + n > self.total:
            return over_budget(self.total)
        self.used += n
        if tenant is not None and n:
            self.by_tenant[tenant] = mine + n
        return None

    def give(self, n: int, tenant: str | None) -> None:
        self.used -= n
        if tenant is not None and n:
            left = self.by_tenant.pop(tenant) - n
            if left:
                self.by_tenant[tenant] = left


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return max(int(value), 0)
            except ValueError:
                return None  # the HTTP parser refuses it before we run
    return None


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limits: RouteLimits, budget: BodyBudget,
                 timeout_s: float) -> None:
        self.app = app
        self.limits = limits
        self.budget = budget
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        principal = scope.get(PRINCIPAL)
        tenant = principal.tenant if principal is not None else None
        limit, what = self.limits(scope["method"], scope["path"], principal)
        cap, setting = self.budget.cap(tenant)
        if cap < limit:  # larger than every body in flight may be together:
            limit, what = cap, f"{what}, capped by {setting}"
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(send, too_large(limit, what))
            return
        held = declared or 0  # a declared body is reserved whole; a chunked one as it comes
        if (refused := self.budget.take(held, tenant)) is not None:
            await self._refuse(send, refused)
            return
        seen = 0
        done = False  # the body has ended: a later receive waits for the disconnect, untimed
        started = False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def limited_receive() -> Message:
            nonlocal seen, held, done
            if done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise body_late(self.timeout_s) from None
            done = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(limit, what)
                if seen > held:
                    if (refused := self.budget.take(seen - held, tenant)) is not None:
                        raise refused
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
            self.budget.give(held, tenant)

    @staticmethod
    async def _refuse(send: Send, exc: BodyRefused) -> None:
        await send_error(send, exc.status_code, exc.code, str(exc.detail), retry_after(exc))


def retry_after(exc: BodyRefused) -> list[tuple[bytes, bytes]]:
    """``Retry-After: 1`` for a refusal that a retry may get past (429, 503)."""
    return [(b"retry-after", b"1")] if exc.status_code in (429, 503) else []
