"""The data-plane protocol, defined once for the server and every client: the frame codec
(:mod:`.frame`) and one typed message per op (:mod:`.session`, :mod:`.blocks`, :mod:`.shm`),
looked up by op name in :mod:`.ops`."""

from __future__ import annotations

from kvstore.protocol.blocks import (
    SUM_BYTES,
    Check,
    CheckReply,
    Delete,
    DeleteReply,
    Get,
    GetReply,
    Lookup,
    LookupReply,
    Pin,
    PinReply,
    Prefetch,
    PrefetchReply,
    Put,
    PutReply,
    Release,
    ReleaseReply,
    pack_sums,
)
from kvstore.protocol.frame import PROTOCOL_VERSION, Buffer, FrameError
from kvstore.protocol.message import Header, Limits, Reply, Request
from kvstore.protocol.ops import REQUESTS, decode_request, request_type
from kvstore.protocol.session import (
    Ack,
    DeleteNamespace,
    DeleteNamespaceReply,
    Flush,
    Health,
    HealthReply,
    Hello,
    HelloReply,
    Namespaces,
    NamespacesReply,
    Ping,
    Register,
    RegisterReply,
    Stats,
    StatsReply,
)
from kvstore.protocol.shm import (
    AbortReply,
    Extents,
    ExtentsReply,
    ShmAbort,
    ShmAcquire,
    ShmCheck,
    ShmCommit,
    ShmLookup,
    ShmLookupReply,
    ShmPut,
    ShmPutReply,
    ShmRelease,
    ShmReserve,
    ShmStage,
    StageReply,
    first_offsets,
)

__all__ = [
    "PROTOCOL_VERSION", "REQUESTS", "SUM_BYTES", "AbortReply", "Ack", "Buffer", "Check",
    "CheckReply", "Delete", "DeleteNamespace", "DeleteNamespaceReply", "DeleteReply",
    "Extents", "ExtentsReply", "Flush", "FrameError", "Get", "GetReply", "Header", "Health",
    "HealthReply", "Hello", "HelloReply", "Limits", "Lookup", "LookupReply", "Namespaces",
    "NamespacesReply", "Pin", "PinReply", "Ping", "Prefetch", "PrefetchReply", "Put",
    "PutReply", "Register", "RegisterReply", "Release", "ReleaseReply", "Reply", "Request",
    "ShmAbort", "ShmAcquire", "ShmCheck", "ShmCommit", "ShmLookup", "ShmLookupReply", "ShmPut",
    "ShmPutReply", "ShmRelease", "ShmReserve", "ShmStage", "StageReply", "Stats", "StatsReply",
    "decode_request", "first_offsets", "pack_sums", "request_type",
]
