"""Data plane frame codec, shared by the server and the clients.

A frame is an 8-byte prefix, a msgpack header and a raw payload::

    >I header_len | >I payload_len | header (msgpack map) | payload (payload_len bytes)

The header carries the op and its arguments (requests) or the result (replies); the payload
carries block bytes back to back, their sizes listed in the header's ``sizes``. Keeping block
bytes out of msgpack lets both ends read and write them with one copy (``recv_into`` /
scatter-gather ``sendmsg``), which is what makes the TCP path cheaper than a Redis ``GET``.

Requests: ``{"op": str, "id": int, ...}``. Replies: ``{"id": int, "ok": True, ...}`` or
``{"id": int, "ok": False, "error": {"code": str, "message": str}}``. What each op carries is
one typed message in :mod:`kvstore.protocol` (and documented in ``docs/operations.md``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack

from kvstore.types import Buffer

PREFIX = struct.Struct(">II")
PREFIX_BYTES = PREFIX.size
MAX_HASH_BYTES = 64  # longest block hash accepted (sha256 is 32, xxhash 8)
PROTOCOL_VERSION = 2  # 2: a put may send its checksums after its blocks (``trailer``)


class FrameError(Exception):
    """A frame that cannot be decoded or a request that breaks the protocol. ``code`` is the
    error code sent back; ``fatal`` means the framing is lost and the connection must close."""

    def __init__(self, code: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal


def ok_reply(rid: int, fields: dict[str, Any]) -> dict[str, Any]:
    """The header of a successful reply to request ``rid``."""
    return {"id": rid, "ok": True, **fields}


def error_reply(rid: int, code: str, message: str) -> dict[str, Any]:
    """The header of an error reply to request ``rid`` (0 when the request is unknown)."""
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}}


def pack_header(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def encode_frame(header: dict[str, Any], payload: Sequence[Buffer] = ()) -> list[Buffer]:
    """The pieces of one frame, ready for ``sendmsg``/``writelines``: the prefix plus header as
    one ``bytes``, then the payload buffers untouched (no copy)."""
    head = pack_header(header)
    size = sum(memoryview(p).nbytes for p in payload)
    return [PREFIX.pack(len(head), size) + head, *payload]


def decode_prefix(data: Buffer, max_header: int, max_payload: int) -> tuple[int, int]:
    """``(header_len, payload_len)``; raises a fatal :class:`FrameError` if either is over its
    limit or the header is empty (the stream cannot be resynchronised after that)."""
    header_len, payload_len = PREFIX.unpack(data)
    if header_len == 0:
        raise FrameError("bad_frame", "empty frame header", fatal=True)
    if header_len > max_header:
        raise FrameError(
            "too_large", f"frame header of {header_len} bytes exceeds the {max_header} limit",
            fatal=True,
        )
    if payload_len > max_payload:
        raise FrameError(
            "too_large", f"frame payload of {payload_len} bytes exceeds the {max_payload} limit",
            fatal=True,
        )
    return header_len, payload_len


def decode_header(data: Buffer) -> dict[str, Any]:
    """The header map; raises :class:`FrameError` (not fatal: the length was right) if it is
    not valid msgpack or not a map with string keys."""
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for garbage; all mean the same
        raise FrameError("bad_frame", f"header is not valid msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError("bad_frame", f"header must be a msgpack map, got {type(header).__name__}")
    return header


def split_payload(payload: memoryview, sizes: Sequence[int]) -> list[memoryview]:
    """Views of each block in ``payload`` (no copy)."""
    out: list[memoryview] = []
    pos = 0
    for s in sizes:
        out.append(payload[pos:pos + s])
        pos += s
    return out
