"""Errors the clients raise. Each names the problem; :class:`KVStoreUnavailableError` is also
a ``ConnectionError`` so that callers can fall back (recompute) when the server is away."""

from __future__ import annotations

from typing import Any


class KVStoreClientError(Exception):
    """Base class. ``code`` is the server's error code (or ``unavailable``/``protocol``)."""

    code = "error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class KVStoreUnavailableError(KVStoreClientError, ConnectionError):
    """The server cannot be reached (down, restarting, wrong address) or timed out."""

    code = "unavailable"


class ProtocolError(KVStoreClientError):
    """The server sent something the client does not understand."""

    code = "protocol"


class AuthenticationError(KVStoreClientError):
    """Missing or wrong token."""


class PermissionDeniedError(KVStoreClientError):
    """The token's tenant may not use this namespace."""


class UnknownNamespaceError(KVStoreClientError, KeyError):
    """The namespace was never registered."""

    def __str__(self) -> str:
        return self.message


class NamespaceConflictError(KVStoreClientError):
    """The namespace exists with a different layout, block size, hash algorithm or seed."""


class BlockSizeError(KVStoreClientError, ValueError):
    """A block's size does not match its namespace."""


class CapacityError(KVStoreClientError):
    """No room: every evictable block is pinned."""


class PinQuotaError(KVStoreClientError):
    """The token's tenant holds as many pinned bytes as the server allows
    (``max_pinned_bytes_per_tenant``): nothing was pinned; release pins first."""


class ServerBusyError(KVStoreClientError):
    """The server refused the request for now, having as much of its kind as it allows (a
    frame past its memory budget, prefetches past its queue, a connection past its caps):
    nothing was done; retry later."""

    code = "busy"


class StoreUnavailableError(KVStoreClientError):
    """The server answered, but a tier it needs cannot serve right now."""


class BadRequestError(KVStoreClientError, ValueError):
    """The request was malformed (bad hash, too large, unknown op)."""


class StaleExtentsError(KVStoreClientError):
    """Extents handed out earlier no longer belong to their block (its lease ran out and the
    slots were freed, maybe reused): nothing was written, or what was read is not that
    block's. A read treats it as a miss; a write as refused."""


class StaleStagingError(KVStoreClientError):
    """A put named staged shared-memory places the server no longer holds for us (it dropped
    our leases). The client handles it: it forgets them and writes the batch again."""


_BY_CODE: dict[str, type[KVStoreClientError]] = {
    "unauthenticated": AuthenticationError,
    "forbidden": PermissionDeniedError,
    "unknown_namespace": UnknownNamespaceError,
    "namespace_conflict": NamespaceConflictError,
    "block_size": BlockSizeError,
    "capacity": CapacityError,
    "pin_quota": PinQuotaError,
    "busy": ServerBusyError,
    "stale_staging": StaleStagingError,
    "unavailable": StoreUnavailableError,
    "namespace_limit": CapacityError,
    "disk_full": StoreUnavailableError,
}


def error_from(code: str, message: str) -> KVStoreClientError:
    """The exception for a server error code (unknown codes: :class:`BadRequestError` for
    4xx-like codes, :class:`KVStoreClientError` otherwise)."""
    cls = _BY_CODE.get(code, KVStoreClientError if code == "internal" else BadRequestError)
    return cls(f"{code}: {message}", code)


def from_reply(reply: dict[str, Any]) -> KVStoreClientError:
    err = reply.get("error")
    if not isinstance(err, dict):
        return ProtocolError("error reply without an error map")
    return error_from(str(err.get("code", "error")), str(err.get("message", "")))
