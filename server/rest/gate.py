"""The REST plane's front gate: a pure ASGI middleware that checks the bearer token from the
request headers before any body byte is read, and bounds the requests in flight.

FastAPI resolves a route's body before its dependencies, so a token check written as a
dependency runs only after the whole body has been received and parsed: an unauthenticated
60 MiB JSON body would cost a second of CPU and a GiB of memory before its 401. Here the 401
leaves with ``Connection: close`` and the body is never read.

Requests that pass the gate count against ``max_connections`` (503 above it). Public paths
(``/healthz``, the API documents and the dashboard's page, which holds no data) skip the token
check, and ``/healthz`` is never counted,
so that probes answer even when the server is saturated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from server.auth import Authenticator
from server.errors import AuthError
from server.rest.dashboard import PATHS as DASHBOARD_PATHS

Scope = dict[str, Any]
PRINCIPAL = "kvstore.principal"  # the scope key of the caller the gate let in (a Principal)

PUBLIC_PATHS = frozenset({"/", "/healthz", "/health", "/docs", "/docs/oauth2-redirect",
                          "/redoc", "/openapi.json", *DASHBOARD_PATHS})
UNCOUNTED_PATHS = frozenset({"/healthz", "/health"})


def bearer_token(scope: Mapping[str, Any]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


async def send_error(send: Any, status: int, code: str, message: str,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A complete JSON error response that also closes the connection (the request's body,
    if any, is left unread)."""
    body = json.dumps({"error": code, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class GateMiddleware:
    """401 before the body for a missing or wrong token; 503 over ``max_in_flight``."""

    def __init__(self, app: Any, auth: Authenticator, max_in_flight: int) -> None:
        self.app = app
        self.auth = auth
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path not in PUBLIC_PATHS:
            try:
                scope[PRINCIPAL] = self.auth.authenticate(bearer_token(scope))
            except AuthError as exc:
                await send_error(send, 401, "unauthenticated", str(exc),
                                 [(b"www-authenticate", b"Bearer")])
                return
        if path in UNCOUNTED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            await send_error(send, 503, "busy",
                             f"{self.in_flight} requests in flight, the limit is "
                             f"{self.max_in_flight} (max_connections); retry shortly",
                             [(b"retry-after", b"1")])
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
