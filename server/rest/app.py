"""The FastAPI application: routes, error mapping and limits around an open store.

``create_app`` takes everything it needs (no globals), so tests and the runtime build it the
same way. Every error leaves as ``{"error": code, "message": text}`` with the status from
:mod:`server.errors`; anything unmapped is a bug and leaves as a logged 500.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from kvstore.errors import KVStoreError, UnknownNamespaceError
from kvstore.protocol.info import ServerInfo
from kvstore.store import StoreAPI
from server.auth import Authenticator, Principal
from server.dataplane.context import nowait_first
from server.dataplane.direct_get import direct_get
from server.errors import (
    AuthError,
    BlockNotFoundError,
    ForbiddenError,
    InvalidRequestError,
    map_error,
)
from server.metrics import ServerMetrics
from server.rest import blocks, cluster, dashboard, explain, health, namespaces, ops, whatif
from server.rest.gate import GateMiddleware
from server.rest.limits import (
    BodyBudget,
    BodyLimitMiddleware,
    BodyRefused,
    RouteLimits,
    retry_after,
)
from server.rest.observe import ObserveMiddleware
from server.settings import ServerSettings
from server.tenant_view import resolve

if TYPE_CHECKING:
    from kvstore.cluster.node import ClusterNode
    from server.peer_fill import PeerFill

log = logging.getLogger("kvstore.server")
_MAPPED = (KVStoreError, AuthError, ForbiddenError, BlockNotFoundError, InvalidRequestError)


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(printable({"error": code, "message": message, **extra}),
                        status_code=status, headers=headers)


def printable(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) written as an escape:
    JSON text may carry one (``"\\ud800"``), UTF-8 cannot, and an error that quotes the
    request's text must not fail to encode (that was a 500)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    return value


async def _not_unicode(request: Request, exc: Exception) -> JSONResponse:
    """Text of the request that cannot be encoded (JSON's ``"\\ud800"``, a lone surrogate,
    reaching a hash, a file name or the reply): the request's fault, not the server's."""
    assert isinstance(exc, UnicodeEncodeError)
    return _error(400, "invalid_text", f"the request holds text that is not valid Unicode "
                                       f"(a lone surrogate, U+{ord(exc.object[exc.start]):04X})")


async def _mapped_error(request: Request, exc: Exception) -> JSONResponse:
    mapped = map_error(exc)
    if mapped is None:  # not reachable for _MAPPED types; kept for type narrowing
        return await _unexpected_error(request, exc)
    return _error(mapped.status, mapped.code, str(exc))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = jsonable_encoder(exc.errors(), custom_encoder={bytes: lambda b: repr(b)})
    shown = printable(details)
    first = shown[0] if shown else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    message = f"{where}: {first.get('msg', 'invalid request')}"
    if shown != details:  # a lone surrogate: the text is not Unicode, whatever the schema
        return _error(400, "invalid_text", f"{message}; JSON text must be valid Unicode "
                      "(a lone surrogate escape such as \\ud800 is not)", detail=shown)
    return _error(422, "validation", message, detail=details)


async def _body_refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BodyRefused)
    headers = {"Connection": "close", **{k.decode(): v.decode() for k, v in retry_after(exc)}}
    return _error(exc.status_code, exc.code, str(exc.detail), headers=headers)


async def _client_gone(request: Request, exc: Exception) -> JSONResponse:
    """A client that closed its connection before its body ended: nothing is wrong with the
    server, and nobody reads the answer (the route held nothing yet: the body comes first)."""
    log.debug("client left during %s %s before its request body ended", request.method,
              request.url.path)
    return _error(400, "incomplete", "the connection closed before the request body ended",
                  headers={"Connection": "close"})


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # Starlette lists one route's methods; list the whole path's
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return _error(exc.status_code, "http_error", str(exc.detail), headers=headers)


def _allowed_methods(request: Request) -> list[str]:
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)  # PARTIAL: the path matches, the method not
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    return _error(500, "internal", "internal server error; see the server log")


def create_app(store: StoreAPI, settings: ServerSettings, info: ServerInfo, metrics: ServerMetrics,
               durable_tier: str | None, node: ClusterNode | None = None,
               fill: PeerFill | None = None) -> FastAPI:
    app = FastAPI(
        title="kvstore",
        version=info.version,
        description="Tiered KV-cache block store: REST control plane. Block bytes at volume "
                    "move over the data plane (see /v1/info).",
    )
    app.state.store = store
    app.state.settings = settings
    app.state.auth = Authenticator(settings)
    app.state.info = info
    app.state.registry = metrics.registry
    app.state.durable_tier = durable_tier
    app.state.closing = False
    app.state.cluster = node
    app.state.fill = fill
    # block GETs pin what the host slab holds and send it from there (server.rest.slab_body)
    app.state.direct_get = direct_get(store, partial(nowait_first, run_in_threadpool),
                                      run_in_threadpool, settings.frame_timeout_s,
                                      settings.max_lease_s)
    for router in (namespaces.router, ops.router, explain.router, blocks.router, health.router,
                   dashboard.router, cluster.router, whatif.router):
        app.include_router(router)
    for exc_type in _MAPPED:
        app.add_exception_handler(exc_type, _mapped_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(BodyRefused, _body_refused)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(UnicodeEncodeError, _not_unicode)
    app.add_exception_handler(Exception, _unexpected_error)

    # added before `observe`, so inside it: a refusal raised from ``receive`` reaches the
    # route directly
    app.add_middleware(BodyLimitMiddleware,
                       budget=BodyBudget(settings.rest_body_budget_bytes,
                                         settings.rest_body_budget_per_tenant_bytes),
                       limits=RouteLimits(settings.max_request_bytes, settings.max_batch,
                                          lambda name, who: _block_bytes(store, who, name)),
                       timeout_s=settings.rest_body_timeout_s)

    app.add_middleware(ObserveMiddleware, metrics=metrics)

    # added last, so outermost: no body byte is read, or budgeted, before the token is checked
    app.add_middleware(GateMiddleware, auth=app.state.auth, max_in_flight=settings.max_connections)
    if not settings.auth_enabled():
        app.openapi = lambda: _without_security(app)  # type: ignore[method-assign]
    return app


def _block_bytes(store: StoreAPI, principal: Principal, name: str) -> int | None:
    try:
        return resolve(store, principal, name).block_bytes
    except UnknownNamespaceError:
        return None


def _without_security(app: FastAPI) -> dict[str, Any]:
    """The schema as served when no token is configured: no operation asks for one."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        for item in schema.get("paths", {}).values():
            for op in item.values():
                op.pop("security", None)
                op.get("responses", {}).pop("401", None)
        schema.get("components", {}).pop("securitySchemes", None)
        app.openapi_schema = schema
    return app.openapi_schema
