"""One table from errors to HTTP statuses and data plane error codes, so that both planes
report the same problem the same way."""

from __future__ import annotations

from typing import NamedTuple

from kvstore.errors import (
    BlockSizeError,
    BusyError,
    CapacityError,
    ChecksumMismatchError,
    DiskFullError,
    InvalidHashError,
    KVStoreError,
    NamespaceConflictError,
    NamespaceLimitError,
    PinQuotaError,
    StaleStagingError,
    TierUnavailableError,
    UnknownNamespaceError,
)


class AuthError(Exception):
    """Missing or unknown bearer token (401)."""


class ForbiddenError(Exception):
    """A valid token asked for something outside its tenants (403)."""


class BlockNotFoundError(Exception):
    """A single-block GET or DELETE named a block the store does not hold (404)."""


class InvalidRequestError(Exception):
    """A request that passed the schema but describes an impossible thing (422)."""


class Mapped(NamedTuple):
    status: int
    code: str


# Most specific first: the first isinstance match wins.
_TABLE: tuple[tuple[type[BaseException], Mapped], ...] = (
    (AuthError, Mapped(401, "unauthenticated")),
    (InvalidRequestError, Mapped(422, "invalid_request")),
    (ForbiddenError, Mapped(403, "forbidden")),
    (UnknownNamespaceError, Mapped(404, "unknown_namespace")),
    (BlockNotFoundError, Mapped(404, "block_not_found")),
    (NamespaceConflictError, Mapped(409, "namespace_conflict")),
    (StaleStagingError, Mapped(409, "stale_staging")),
    (BlockSizeError, Mapped(400, "block_size")),
    (ChecksumMismatchError, Mapped(400, "checksum_mismatch")),
    (InvalidHashError, Mapped(400, "invalid_hash")),
    (CapacityError, Mapped(507, "capacity")),
    (PinQuotaError, Mapped(429, "pin_quota")),
    (BusyError, Mapped(503, "busy")),
    (NamespaceLimitError, Mapped(507, "namespace_limit")),
    (DiskFullError, Mapped(507, "disk_full")),
    (TierUnavailableError, Mapped(503, "unavailable")),
    (KVStoreError, Mapped(400, "bad_request")),
)


def map_error(exc: BaseException) -> Mapped | None:
    """The status and code for ``exc``, or None for an unexpected error (a bug: 500)."""
    for cls, mapped in _TABLE:
        if isinstance(exc, cls):
            return mapped
    return None

