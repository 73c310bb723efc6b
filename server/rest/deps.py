"""FastAPI dependencies: the store, the settings and the calling principal, all taken from
``app.state`` (set once by :func:`server.rest.app.create_app`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kvstore.store import StoreAPI
from server.auth import Authenticator, Principal
from server.rest.schemas import ErrorBody

bearer = HTTPBearer(auto_error=False, description="admin or tenant token, if configured")


# Dependencies are ``async``: FastAPI runs a plain ``def`` dependency in a worker thread, a
# thread hop per dependency per request for what is an attribute read.
async def get_store(request: Request) -> StoreAPI:
    store: StoreAPI = request.app.state.store
    return store


async def current_principal(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Principal:
    """The caller; raises AuthError (401) on a missing or wrong token when auth is on."""
    auth: Authenticator = request.app.state.auth
    return auth.authenticate(creds.credentials if creds else None)


StoreDep = Annotated[StoreAPI, Depends(get_store)]
PrincipalDep = Annotated[Principal, Depends(current_principal)]

_DESCRIPTIONS = {
    400: "bad input: unparseable body, block of the wrong size, hash of the wrong length",
    401: "missing or invalid bearer token",
    403: "a tenant token asked for what only the admin may do (or for another tenant)",
    404: "unknown namespace or block",
    409: "namespace exists with a different definition",
    413: "request body over the configured limit",
    422: "request does not match the schema (bad hex, wrong types, out of range)",
    503: "the store cannot serve right now",
    507: "no room: every evictable block is pinned, the disk is full, or the namespace limit "
         "is reached",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given error statuses (all :class:`ErrorBody`)."""
    return {c: {"model": ErrorBody, "description": _DESCRIPTIONS[c]} for c in codes}
