"""``GET /v1/cluster``: this node, its link to Redis and every node of its cluster (the
admin's: it names every node's address and holdings); a 404 on a node without a cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException

from kvstore.protocol.cluster import ClusterStatus
from server.errors import ForbiddenError
from server.rest.deps import PrincipalDep, errors
from server.rest.schemas import ErrorBody

if TYPE_CHECKING:
    from kvstore.cluster.node import ClusterNode

router = APIRouter(tags=["cluster"])


NOT_IN_A_CLUSTER: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "this node is not in a cluster"}}


@router.get("/v1/cluster", response_model=ClusterStatus,
            responses={**errors(401, 403), **NOT_IN_A_CLUSTER})
def cluster_status(request: Request, principal: PrincipalDep) -> ClusterStatus:
    """Nodes with their state (up, suspect, gone), address, tiers and blocks held, how long
    since each was heard from; this node's view of Redis (connected, degraded) and of its
    index updates. Asks Redis, so it runs in a worker thread."""
    if not principal.admin:
        raise ForbiddenError("the cluster's status is for the admin token")
    node: ClusterNode | None = request.app.state.cluster
    if node is None:
        raise HTTPException(404, "this node is not in a cluster (start it with --cluster "
                                 "redis://HOST:PORT/DB)")
    return node.status()
