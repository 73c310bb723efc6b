"""What one data plane frame gets back: its header decoded, its op dispatched (or a direct put
committed) and the reply or error it earns, as an :class:`Answer`.

Nothing here touches the connection's socket or buffers: :mod:`server.dataplane.conn` hands
over the frame it has read and writes what comes back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from kvstore.protocol import REQUESTS
from kvstore.protocol.frame import Buffer, FrameError, decode_header, error_reply, ok_reply
from server.dataplane.context import Session
from server.dataplane.direct_put import DirectPut
from server.errors import map_error

if TYPE_CHECKING:
    from server.dataplane.ops import Ops

log = logging.getLogger("kvstore.dataplane")


class Answer(NamedTuple):
    """A served frame's outcome: ``reply`` (and its ``blobs``) for request ``rid``, the
    ``status`` the metrics count it under, whether the client asked for no reply, and whether
    the error was ``fatal`` (the connection closes after replying)."""

    rid: Any
    op: str
    reply: dict[str, Any]
    blobs: list[Buffer]
    status: str
    noreply: bool
    fatal: bool


async def answer(ops: Ops, session: Session, direct: DirectPut | None, header_bytes: bytes,
                 payload: memoryview) -> Answer:
    """Serve one frame: dispatch its op through ``ops`` (or commit ``direct``, a put whose
    payload was read straight into the host tier). Never raises: an error becomes an error
    reply."""
    rid: Any = 0
    op = "unknown"
    noreply = False
    try:
        header = decode_header(header_bytes)
        rid = header.get("id", 0)
        rid = rid if isinstance(rid, int) and not isinstance(rid, bool) else 0
        noreply = header.get("noreply") is True
        name = header.get("op")
        op = name if isinstance(name, str) and name in REQUESTS else "unknown"
        if direct is not None:
            fields, blobs = await ops.commit_direct(direct)
        else:
            fields, blobs = await ops.dispatch(session, header, payload)
        return Answer(rid, op, ok_reply(rid, fields), blobs, "ok", noreply, False)
    except Exception as exc:
        code, message, fatal = describe(exc, op)
        # a fatal error is always answered, noreply or not: the client learns why it closed
        return Answer(rid, op, error_reply(rid, code, message), [], code,
                      noreply and not fatal, fatal)


def busy_reply(rid: Any, why: str) -> dict[str, Any]:
    """The error reply of a connection refused a slot (``why``: which limit)."""
    return error_reply(rid, "busy", why)


def describe(exc: Exception, op: str) -> tuple[str, str, bool]:
    """``(code, message, fatal)`` for an error raised while serving a frame."""
    if isinstance(exc, FrameError):
        return exc.code, exc.message, exc.fatal
    mapped = map_error(exc)
    if mapped is not None:
        return mapped.code, str(exc), mapped.code == "unauthenticated"
    log.exception("unexpected error serving data plane op %s", op)
    return "internal", f"internal error: {type(exc).__name__}", False
