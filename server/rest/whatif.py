"""``/v1/whatif``: the hit rate a tier would have at capacities around today's (its live
miss-ratio curve, :mod:`kvstore.store.sizing`) and, asked with ``advise=true``, what the next
steps of capacity would save in prefill; ``POST /v1/whatif/reset`` starts the curves again.

A tenant sees the curve of its own namespaces only (their requests in the shared tier), named
as it names them, without the tier's count of tracked blocks (the others' traffic).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.exceptions import HTTPException

from kvstore.protocol.whatif import AdviceOut, WhatIfOut
from server.errors import ForbiddenError, InvalidRequestError
from server.rest.deps import PrincipalDep, StoreDep, errors
from server.tenant_view import resolve, shown_name, visible

router = APIRouter(prefix="/v1", tags=["operations"])


@router.get("/whatif", response_model=WhatIfOut, response_model_exclude_none=True,
            responses=errors(401, 404, 422))
def whatif(
    request: Request,
    principal: PrincipalDep,
    store: StoreDep,
    tier: Annotated[str | None, Query(description="a tier's name; default: the top tier")] = None,
    namespace: Annotated[str | None, Query(description="one namespace; default: every "
                                           "namespace the caller may see")] = None,
    policy: Annotated[str | None, Query(description="the eviction policy; default: the "
                                        "tier's own (others: whatif_policies)")] = None,
    advise: Annotated[bool, Query(description="add the capacity advisor's prices")] = False,
    prefill_tokens_per_s: Annotated[float | None, Query(
        gt=0, description="the engine's prefill rate to price misses at; default: the "
        "server's prefill_tokens_per_s")] = None,
) -> WhatIfOut:
    """The tier's curve: hit rate at 17 capacities from a quarter of today's to four times
    it, for the requests of the scope, from a sample of block hashes. Runs in a worker
    thread (it takes the store lock)."""
    name = tier or store.tier_names()[0]
    if name not in store.tier_names():
        raise InvalidRequestError(f"no tier {name!r}; tiers: {', '.join(store.tier_names())}")
    if namespace is not None:
        scope: list[str] | None = [resolve(store, principal, namespace).name]
    else:
        scope = None if principal.admin else [ns.name for ns in visible(store, principal)]
    try:  # the advice holds the curve: asked with it, the curve is built once
        rate = prefill_tokens_per_s or request.app.state.settings.prefill_tokens_per_s
        advice = store.advise(name, scope, policy, rate) if advise else None
        curve = store.whatif(name, scope, policy) if advice is None else advice.curve
    except LookupError as exc:  # the curves are off
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:  # a policy the tier does not simulate
        raise InvalidRequestError(str(exc)) from None
    out = WhatIfOut.from_curve(curve)
    if scope is not None:
        out.namespaces = [shown_name(principal, n) for n in scope]
    if not principal.admin:
        out.tracked_keys = None
    if advice is not None:
        out.advice = AdviceOut.from_advice(
            advice, [shown_name(principal, n) for n in advice.unpriced])
    return out


@router.post("/whatif/reset", status_code=204, responses=errors(401, 403, 404))
def reset(principal: PrincipalDep, store: StoreDep) -> Response:
    """Start every tier's curves again from now (after a change in traffic or capacity is
    what the next curves should describe). The admin's."""
    if not principal.admin:
        raise ForbiddenError("resetting the what-if curves is for the admin token")
    store.reset_whatif()
    return Response(status_code=204)
