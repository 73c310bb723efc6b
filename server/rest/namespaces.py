"""``/v1/namespaces``: register, list, show and delete namespaces (a thin adapter over the
store; names as the caller calls them: :mod:`server.tenant_view`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from kvstore.protocol.stats import Counts
from server.errors import InvalidRequestError
from server.rest.deps import PrincipalDep, StoreDep, errors
from server.rest.schemas import (
    REF_PATTERN,
    NamespaceDeleted,
    NamespaceIn,
    NamespaceList,
    NamespaceOut,
    NamespaceShown,
)
from server.tenant_view import as_seen, resolve, to_register, visible

router = APIRouter(prefix="/v1", tags=["namespaces"])
NamePath = Annotated[str, Path(pattern=REF_PATTERN, description="namespace name (the admin "
                                                                 "names a tenant's tenant~name)")]


@router.post(
    "/namespaces",
    status_code=201,
    response_model=NamespaceOut,
    responses={
        200: {"model": NamespaceOut, "description": "an identical namespace already exists"},
        **errors(400, 401, 403, 409, 413, 422, 507),
    },
)
def register_namespace(
    body: NamespaceIn,
    response: Response,
    principal: PrincipalDep,
    store: StoreDep,
) -> NamespaceOut:
    """Register a namespace: 201 if new, 200 if identical, 409 if it exists with another
    layout, block size, hash algorithm or seed. Names are the tenant's own: two tenants may
    both register ``chat``."""
    try:
        ns = to_register(store, principal, body.to_namespace(None), body.tenant)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    created = store.register_namespace(ns)
    if not created:
        response.status_code = 200
    return NamespaceOut.of(as_seen(principal, store.namespace(ns.name)))


@router.get("/namespaces", response_model=NamespaceList, responses=errors(401))
def list_namespaces(
    principal: PrincipalDep, store: StoreDep
) -> NamespaceList:
    """The namespaces this token may see."""
    return NamespaceList(namespaces=[NamespaceOut.of(as_seen(principal, ns))
                                     for ns in visible(store, principal)])


@router.get("/namespaces/{name}", response_model=NamespaceShown,
            responses=errors(401, 404, 422))
def show_namespace(name: NamePath, principal: PrincipalDep, store: StoreDep) -> NamespaceShown:
    """One namespace: its definition and its row of ``/v1/stats`` (zeros before any
    traffic)."""
    ns = resolve(store, principal, name)
    stats = store.stats()
    row = stats.namespaces.get(ns.name) or Counts(capacity_bytes=stats.totals.capacity_bytes)
    return NamespaceShown(**as_seen(principal, ns).to_dict(), stats=row)


@router.delete("/namespaces/{name}", response_model=NamespaceDeleted,
               responses=errors(401, 404, 422, 503))
def delete_namespace(name: NamePath, principal: PrincipalDep,
                     store: StoreDep) -> NamespaceDeleted:
    """Forget a namespace and remove its blocks from every tier. A tenant token may delete
    only its own namespaces; the admin any."""
    ns = resolve(store, principal, name)
    return NamespaceDeleted(name=as_seen(principal, ns).name,
                            blocks=store.delete_namespace(ns.name))
