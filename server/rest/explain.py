"""``/v1/explain``: why a prompt hits or misses, block by block (a thin adapter over
:func:`kvstore.explain.explain`: it checks the tenant and picks the namespaces it may see)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from kvstore.errors import KVStoreError
from kvstore.explain import explain
from kvstore.protocol.explain import ExplainOut
from server.errors import InvalidRequestError
from server.rest.deps import PrincipalDep, StoreDep, errors
from server.rest.explain_schemas import MAX_EXPLAIN_BLOCKS, ExplainIn
from server.tenant_view import resolve, shown_name, visible

router = APIRouter(prefix="/v1", tags=["operations"])


@router.post("/explain", response_model=ExplainOut,
             responses=errors(400, 401, 404, 413, 422, 503))
def explain_prompt(request: Request, body: ExplainIn, principal: PrincipalDep,
                   store: StoreDep) -> ExplainOut:
    """Hash the prompt's tokens (with its cache salt, LoRA and multimodal inputs) as the
    engine would with the namespace's recipe, and say for each full block whether it is
    stored (in which tiers), evicted (when, from which tier, why: from the ghost record of
    recent departures), never seen, or held under another namespace's recipe (which of hash
    algorithm, seed and block size differs), with hints. A tenant explains only its own
    namespaces and sees only its own in ``other``. No side effects. At most 1024 block rows
    per answer (``offset`` and ``limit`` page through the rest); a prompt of more than 16384
    full blocks (or ``max_batch``) is refused. Runs in a worker thread (a ``def`` route)."""
    ns = resolve(store, principal, body.namespace)
    try:
        result = explain(store, ns, body.to_prompt(), visible(store, principal),
                         max_blocks=min(MAX_EXPLAIN_BLOCKS,
                                        request.app.state.settings.max_batch),
                         shown=lambda name: shown_name(principal, name))
    except KVStoreError:
        raise
    except ValueError as exc:  # tokens or keys the hasher refuses, no block size, too long
        raise InvalidRequestError(_why(exc)) from None
    return ExplainOut.of(result, body.offset, body.limit)


def _why(exc: ValueError) -> str:
    text = str(exc)
    if text.endswith("blocks an explain examines"):  # say which setting and which cap
        text += f" (max_batch, at most {MAX_EXPLAIN_BLOCKS})"
    return text
