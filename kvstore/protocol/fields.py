"""Field readers of request headers: each checks one field's type and raises a
:class:`~kvstore.protocol.frame.FrameError` (``bad_request``, or ``too_large``) naming it."""

from __future__ import annotations

import math
from typing import Any

from kvstore.protocol.frame import MAX_HASH_BYTES, FrameError
from kvstore.types import BlockHash


def arg_str(header: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = header.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise FrameError("bad_request", f"field {key!r} must be a non-empty string")
    return value


def arg_int(header: dict[str, Any], key: str, default: int | None = None) -> int:
    value = header.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FrameError("bad_request", f"field {key!r} must be an integer")
    return value


def arg_float(header: dict[str, Any], key: str) -> float | None:
    """An optional number of seconds: finite and positive (how long the server grants is its
    own business: it cuts leases to its ``max_lease_s``)."""
    value = header.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) \
            or not (value > 0 and math.isfinite(value)):
        raise FrameError("bad_request",
                         f"field {key!r} must be a finite, positive number of seconds")
    return float(value)


def arg_bool(header: dict[str, Any], key: str) -> bool:
    value = header.get(key, False)
    if not isinstance(value, bool):
        raise FrameError("bad_request", f"field {key!r} must be a boolean")
    return value


def arg_hashes(header: dict[str, Any], max_batch: int,
               key: str = "hashes") -> list[BlockHash]:
    """A list of raw hashes, each 1..64 bytes, at most ``max_batch`` of them."""
    value = header.get(key)
    if not isinstance(value, list):
        raise FrameError("bad_request", f"field {key!r} must be a list of binary hashes")
    if len(value) > max_batch:
        raise FrameError("too_large", f"{len(value)} hashes exceed the batch limit {max_batch}")
    for h in value:
        if not isinstance(h, bytes) or not 0 < len(h) <= MAX_HASH_BYTES:
            raise FrameError(
                "bad_request", f"each of {key!r} must be 1-{MAX_HASH_BYTES} bytes of binary"
            )
    return value


def arg_ints(header: dict[str, Any], key: str, count: int) -> list[int]:
    """A list of exactly ``count`` non-negative ints."""
    value = header.get(key)
    if not isinstance(value, list) or len(value) != count or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise FrameError("bad_request", f"field {key!r} must list {count} non-negative integers")
    return value


def arg_sizes(header: dict[str, Any], count: int, payload_len: int) -> list[int]:
    """Per-block sizes of a payload: ``count`` non-negative ints summing to ``payload_len``."""
    sizes = header.get("sizes")
    if not isinstance(sizes, list) or len(sizes) != count:
        raise FrameError("bad_request", f"field 'sizes' must list {count} block sizes")
    for s in sizes:
        if not isinstance(s, int) or isinstance(s, bool) or s < 0:
            raise FrameError("bad_request", "each of 'sizes' must be a non-negative integer")
    if sum(sizes) != payload_len:
        raise FrameError(
            "bad_request", f"'sizes' add up to {sum(sizes)} but the payload has {payload_len} bytes"
        )
    return sizes


MAX_SUM = 2**64 - 1


def arg_sums(header: dict[str, Any], count: int) -> list[int | None] | None:
    """An optional list ``sums`` of ``count`` block checksums (xxh3-64 as unsigned ints, or
    nil for a block the writer did not hash); None when absent."""
    value = header.get("sums")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != count or not all(
            v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SUM)
            for v in value):
        raise FrameError("bad_request", f"field 'sums' must list {count} checksums "
                                        "(unsigned 64-bit integers or nil)")
    return list(value)


def without_none(header: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``header`` without those of ``keys`` that are None: a frame without the optional field
    is byte for byte what peers sent before it existed."""
    for key in keys:
        if key in header and header[key] is None:
            del header[key]
    return header
