"""``/healthz`` (public; 503 when the store cannot serve; also ``/health``), ``/metrics``
(Prometheus), and ``/``, which sends a browser to the dashboard.

Without a token ``/healthz`` says only whether the server can serve: a probe needs no more,
and the tiers' block counts, free slots and paths are nobody else's business. The admin's
token (or any caller when no token is configured) gets each tier's health as the store reports
it; a tenant's token whether each tier is ok (the tiers hold every tenant's blocks). A wrong
token is a 401, as on every other route.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvstore.protocol.health import StoreHealth
from server.auth import Authenticator, Principal
from server.metrics import tenant_registry
from server.rest.deps import PrincipalDep, StoreDep, errors
from server.rest.gate import bearer_token
from server.rest.schemas import HealthStatusOut
from server.tenant_view import visible_health, visible_stats

router = APIRouter(tags=["health"])


def _caller(request: Request) -> Principal | None:
    """Who asks, or None for a request without a token to a server that requires one.
    Raises AuthError (401) for a token that is wrong."""
    auth: Authenticator = request.app.state.auth
    token = bearer_token(request.scope)
    if token is None and auth.enabled:
        return None
    return auth.authenticate(token)


@router.get(
    "/healthz",
    response_model=StoreHealth | HealthStatusOut,
    responses={503: {"model": StoreHealth | HealthStatusOut,
                     "description": "a tier cannot serve, or shutting down"},
               **errors(401)},
)
def healthz(request: Request, store: StoreDep) -> Any:
    """200 when the store can serve, 503 when it cannot (or is shutting down). With a token,
    each tier's health too (a tenant's token: only whether each tier is ok)."""
    caller = _caller(request)
    try:
        health = store.health()
    except Exception as exc:  # a broken back end must read as unhealthy, not as a 500
        health = StoreHealth(ok=False, error=str(exc))
    if request.app.state.closing:
        health = health.model_copy(update={"ok": False, "closing": True})
    status = 200 if health.ok else 503
    if caller is None:
        shown = HealthStatusOut(ok=health.ok, closing=health.closing)
        return JSONResponse(shown.model_dump(exclude_none=True), status_code=status)
    # absent rather than null: closing and error
    return JSONResponse(visible_health(health, caller).doc(), status_code=status)


@router.get("/health", include_in_schema=False)
def health(request: Request, store: StoreDep) -> Any:
    """``/healthz`` under the name the workers and the router answer to."""
    return healthz(request, store)


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    """The dashboard, for someone who opens the server's address in a browser."""
    return RedirectResponse("/dashboard")


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                     "description": "Prometheus text exposition"},
               **errors(401)},
)
def metrics(request: Request, principal: PrincipalDep, store: StoreDep) -> Response:
    """``kvstore_*`` counters and gauges, labelled by tier and namespace. A tenant's token
    gets only its own namespaces and totals over them (as ``/v1/stats``)."""
    registry = request.app.state.registry
    if not principal.admin:
        registry = tenant_registry(lambda: visible_stats(store, principal))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
