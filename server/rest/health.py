"""``/healthz`` (public; 503 when the store cannot serve) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.metrics import tenant_registry
from server.rest.deps import PrincipalDep, StoreDep, errors
from server.rest.schemas import HealthOut
from server.tenant_view import visible_stats

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "a tier cannot serve, or shutting down"}},
)
def healthz(request: Request, store: StoreDep) -> Any:
    """Per-tier health; 503 when the store cannot serve."""
    try:
        doc = store.health()
    except Exception as exc:  # a broken back end must read as unhealthy, not as a 500
        doc = {"ok": False, "tiers": {}, "error": str(exc)}
    if request.app.state.closing:
        doc = {**doc, "ok": False, "closing": True}
    body = HealthOut.model_validate(doc).model_dump()
    return JSONResponse(body, status_code=200 if body["ok"] else 503)


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
