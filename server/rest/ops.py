"""``/v1/lookup``, ``/v1/prefetch``, ``/v1/stats`` and ``/v1/info``: thin adapters that
translate hex to bytes, check the tenant and call the store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request

from kvstore.protocol.info import ServerInfo
from kvstore.protocol.stats import StoreStats
from kvstore.store import StoreAPI
from kvstore.types import BlockHash
from server.auth import Principal
from server.errors import InvalidRequestError
from server.rest.deps import PrincipalDep, StoreDep, errors
from server.rest.schemas import HashesIn, LookupOut, PrefetchOut
from server.tenant_view import resolve, visible_info, visible_stats

if TYPE_CHECKING:
    from server.peer_fill import PeerFill

router = APIRouter(prefix="/v1", tags=["operations"])


def _checked(request: Request, body: HashesIn, principal: Principal,
             store: StoreAPI) -> tuple[str, list[BlockHash]]:
    """The store's name of the namespace and the hashes."""
    ns = resolve(store, principal, body.namespace)
    limit = request.app.state.settings.max_batch
    if len(body.block_hashes) > limit:
        raise InvalidRequestError(f"{len(body.block_hashes)} hashes exceed the limit {limit}")
    return ns.name, body.raw_hashes()


@router.post("/lookup", response_model=LookupOut,
             responses=errors(400, 401, 404, 413, 422, 503))
def lookup(
    request: Request,
    body: HashesIn,
    principal: PrincipalDep,
    store: StoreDep,
) -> LookupOut:
    """The longest cached prefix of a chain of block hashes and the tier of each of its blocks.
    No side effects (recency and leases are untouched), but in a cluster: the run of blocks
    that other nodes hold beyond this node's prefix is first read here."""
    name, hashes = _checked(request, body, principal, store)
    fill: PeerFill | None = request.app.state.fill
    if fill is not None:
        fill.fill(store.namespace(name), hashes)
    result = store.lookup(name, hashes)
    return LookupOut(prefix_blocks=result.prefix_blocks, tiers=list(result.tiers))


@router.post("/prefetch", status_code=202, response_model=PrefetchOut,
             responses=errors(400, 401, 404, 413, 422, 503))
def prefetch(
    request: Request,
    body: HashesIn,
    principal: PrincipalDep,
    store: StoreDep,
) -> PrefetchOut:
    """Start onboarding the blocks toward the top tier; returns at once (202)."""
    name, hashes = _checked(request, body, principal, store)
    store.prefetch(name, hashes)
    return PrefetchOut(accepted=len(hashes))


@router.get("/stats", response_model=StoreStats, response_model_exclude_none=True,
            responses=errors(401))
def stats(
    principal: PrincipalDep, store: StoreDep
) -> StoreStats:
    """Totals, per tier and per namespace. A tenant sees only its namespaces, totals over
    them, and no tiers (the tiers are shared: their counters are everyone's traffic)."""
    return visible_stats(store, principal)


@router.get("/info", response_model=ServerInfo, responses=errors(401))
def info(request: Request, principal: PrincipalDep) -> ServerInfo:
    """How to reach the data plane (TCP port, Unix socket, shared memory, host identity), the
    version and the REST port; the admin's answer also names the data dir."""
    return visible_info(request.app.state.info, principal)
