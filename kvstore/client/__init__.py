"""The Python client of the kvstore data plane: sync and asyncio faces over one core.

``KVStoreClient(url)`` / ``AsyncKVStoreClient(url)`` find the data plane from the REST URL and
move block bytes over a socket, or through the server's shared memory when it runs on this host.
"""

from __future__ import annotations

from kvstore.client.async_client import AsyncKVStoreClient
from kvstore.client.errors import (
    AuthenticationError,
    BadRequestError,
    BlockSizeError,
    CapacityError,
    KVStoreClientError,
    KVStoreUnavailableError,
    NamespaceConflictError,
    PermissionDeniedError,
    PinQuotaError,
    ProtocolError,
    ServerBusyError,
    StaleStagingError,
    StoreUnavailableError,
    UnknownNamespaceError,
)
from kvstore.client.grant import Grant
from kvstore.client.landed import Landed
from kvstore.client.shm import SlabMapping
from kvstore.client.sync_client import KVStoreClient

__all__ = [
    "AsyncKVStoreClient", "AuthenticationError", "BadRequestError", "BlockSizeError",
    "CapacityError", "Grant", "KVStoreClient", "KVStoreClientError", "KVStoreUnavailableError",
    "Landed", "NamespaceConflictError", "PermissionDeniedError", "PinQuotaError", "ProtocolError",
    "ServerBusyError",
    "SlabMapping", "StaleStagingError", "StoreUnavailableError", "UnknownNamespaceError",
]
