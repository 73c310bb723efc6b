"""The op table of the data plane: every request class by its op name, and the lookup that
turns a received header into a typed request."""

from __future__ import annotations

from typing import Any

from kvstore.protocol.blocks import Check, Delete, Get, Lookup, Pin, Prefetch, Put, Release
from kvstore.protocol.frame import FrameError
from kvstore.protocol.message import Header, Limits, Request
from kvstore.protocol.session import (
    DeleteNamespace,
    Flush,
    Health,
    Hello,
    Namespaces,
    Ping,
    Register,
    Stats,
)
from kvstore.protocol.shm import (
    ShmAbort,
    ShmAcquire,
    ShmCheck,
    ShmCommit,
    ShmLookup,
    ShmMap,
    ShmPut,
    ShmRelease,
    ShmReserve,
    ShmStage,
)

REQUESTS: dict[str, type[Request]] = {kind.op: kind for kind in (
    Hello, Ping, Register, Namespaces, Put, Get, Check, Lookup, Prefetch, Pin, Release, Delete,
    Stats, Health, Flush,
    ShmReserve, ShmCommit, ShmAbort, ShmAcquire, ShmRelease, ShmStage, ShmPut, ShmLookup,
    DeleteNamespace,
    ShmMap, ShmCheck,
)}


def request_type(op: Any) -> type[Request]:
    """The request class of ``op``; FrameError ``unknown_op`` listing the known ones."""
    kind = REQUESTS.get(op) if isinstance(op, str) else None
    if kind is None:
        raise FrameError("unknown_op", f"unknown op {op!r}; known: {', '.join(REQUESTS)}")
    return kind


def decode_request(header: Header, limits: Limits) -> Request:
    """The request in a received header: its op looked up, its fields validated."""
    return request_type(header.get("op")).from_header(header, limits)
