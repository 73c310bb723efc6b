"""Who may call an engine worker or the router: one bearer token, read from a file
(``--token-file``, the same file rules as ``kvstore serve``'s, :mod:`server.token_files`).

Closed by default, as ``kvstore serve`` is: without a token a worker or router binds loopback
only (any other ``--host`` is refused at start, one line and exit 2), and its admin routes
(``POST /admin/role``, what the SLO planner calls) answer 403. With a token every route but
``GET /health`` needs ``Authorization: Bearer <token>``; a router sends its workers' token,
and so does the planner.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kvstore.cli_kit import CommandError, is_loopback
from server.token_files import read_token_file

OPEN_PATHS = frozenset({"/health"})  # probes (routers, load balancers) need no token


def load_token(path: str | None, host: str, flag: str = "--token-file") -> str | None:
    """The token in file ``path`` (None: no token). Raises :class:`CommandError` for a file
    that does not hold one token, and for a ``host`` beyond loopback without a token."""
    token = None
    if path:
        try:
            token = read_token_file(path)
        except ValueError as exc:
            raise CommandError(f"{flag}: {exc}") from None
    if token is None and not is_loopback(host):
        raise CommandError(f"--host {host}: binding beyond loopback requires a token; give "
                           f"{flag} PATH (a file holding one token, mode 0600)")
    return token


def bearer(token: str | None) -> dict[str, str]:
    """The headers that present ``token`` (none without one)."""
    return {"authorization": f"Bearer {token}"} if token else {}


def _presented(authorization: str | None) -> str:
    scheme, _, value = (authorization or "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


@dataclass(frozen=True, slots=True)
class Access:
    """One server's token (None: loopback only, no admin routes)."""

    token: str | None

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value grants access (always, without a token)."""
        if self.token is None:
            return True
        return hmac.compare_digest(_presented(authorization).encode(), self.token.encode())

    def check_admin(self, authorization: str | None) -> None:
        """Raise the 403 (no token configured) or 401 (wrong or missing token) of an admin
        route."""
        if self.token is None:
            raise HTTPException(403, "admin routes are closed: start the worker with "
                                     "--token-file and send Authorization: Bearer <token>")
        if not self.allows(authorization):
            raise HTTPException(401, "admin route: give Authorization: Bearer <token>",
                                headers={"WWW-Authenticate": "Bearer"})

    def install(self, app: FastAPI,
                refuse: Callable[[str], Response] | None = None) -> None:
        """Require the token on every route of ``app`` but :data:`OPEN_PATHS`. ``refuse``
        makes the 401's body from its message (default: FastAPI's ``{"detail": ...}``)."""
        if self.token is not None:
            app.add_middleware(_TokenGate, access=self, refuse=refuse or _detail)


def _detail(message: str) -> Response:
    return JSONResponse({"detail": message}, status_code=401)


class _TokenGate:
    """An ASGI gate in front of the app: checks the headers before the app (and its body)
    is touched, and passes streams through untouched (a plain ASGI layer, so a client that
    hangs up mid-stream still reaches the route's own clean-up)."""

    def __init__(self, app: ASGIApp, access: Access, refuse: Callable[[str], Response]) -> None:
        self.app, self.access, self.refuse = app, access, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"]
                      if k == b"authorization"), None)
        if self.access.allows(given):
            await self.app(scope, receive, send)
            return
        reply = self.refuse("missing or invalid bearer token: give Authorization: Bearer "
                            "<token>")
        reply.headers["WWW-Authenticate"] = "Bearer"
        await reply(scope, receive, send)
