"""Messages of the block ops over the socket: ``put``, ``get``, ``check``, ``lookup``,
``prefetch``, ``pin``, ``release``, ``delete``.

Block bytes never go in a header: a put's payload and a get reply's payload carry them back
to back, their sizes in ``sizes`` (``-1`` for a miss in a get reply). A put's checksums go
in its header (``sums``) or, from protocol 2, after its blocks (``trailer``): a writer then
hashes each block right after sending it, while it is in cache, instead of reading every
block once more before the first byte moves.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Self

from kvstore.protocol.fields import arg_bool, arg_float, arg_sizes, arg_sums, without_none
from kvstore.protocol.frame import Buffer, FrameError
from kvstore.protocol.message import Header, Limits, NsRequest, Reply, read_ns_hashes

SUM_BYTES = 8  # one checksum in a put's trailer: xxh3-64, unsigned little-endian


def pack_sums(sums: Sequence[int]) -> bytes:
    """A put's trailer: each block's checksum, in block order."""
    return struct.pack(f"<{len(sums)}Q", *sums)


@dataclass(slots=True)
class Put(NsRequest):
    """Store the payload's blocks; with ``durable`` the reply waits until they are on disk.
    ``sums``: the writer's checksum of each block (xxh3-64); a block whose bytes arrive
    otherwise is refused. With ``trailer`` (protocol 2) the payload ends, after the blocks,
    with every block's checksum (:data:`SUM_BYTES` each, :func:`pack_sums`) and the header
    has no ``sums``; the server reads them with :meth:`read_trailer`."""

    op: ClassVar[str] = "put"
    takes_payload: ClassVar[bool] = True
    sizes: list[int]
    durable: bool = False
    sums: list[int | None] | None = None
    trailer: bool = False

    @property
    def trailer_bytes(self) -> int:
        """Bytes of the payload after the blocks."""
        return SUM_BYTES * len(self.hashes) if self.trailer else 0

    def read_trailer(self, tail: Buffer) -> None:
        """Take ``sums`` from the trailer (the payload's last :attr:`trailer_bytes`)."""
        if self.trailer:
            self.sums = list(struct.unpack(f"<{len(self.hashes)}Q", tail))

    def to_header(self) -> Header:
        header = without_none(NsRequest.to_header(self), "sums")
        if not self.trailer:  # what peers before protocol 2 send
            del header["trailer"]
        return header

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        ns, hashes = read_ns_hashes(header, limits)
        trailer = arg_bool(header, "trailer")
        sums = arg_sums(header, len(hashes))
        if trailer and sums is not None:
            raise FrameError("bad_request", "a put sends its 'sums' in the header or in a "
                                            "trailer, not both")
        tail = SUM_BYTES * len(hashes) if trailer else 0
        if tail > limits.payload_len:
            raise FrameError("bad_request", f"a put with a trailer ends with {tail} bytes of "
                                            f"checksums; its payload has {limits.payload_len}")
        sizes = arg_sizes(header, len(hashes), limits.payload_len - tail)
        return cls(ns, hashes, sizes, arg_bool(header, "durable"), sums, trailer)


@dataclass(slots=True)
class PutReply(Reply):
    """What a put did (also the reply of ``shm_commit``)."""

    stored: int
    existing: int
    refused: int


@dataclass(slots=True)
class Get(NsRequest):
    """The blocks' bytes. ``checked``: the client verifies each block the reply sends out of
    the slab against the reply's checksum as it lands, and reports one that differs with
    ``check``; a server that trusts the client with the slab then sends without hashing
    first (one pass over the bytes instead of two)."""

    op: ClassVar[str] = "get"
    checked: bool = False

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        return cls(*read_ns_hashes(header, limits), arg_bool(header, "checked"))


@dataclass(slots=True)
class GetReply(Reply):
    """Each block's size in the payload, -1 for a miss; ``sums``, where the server sent a
    block straight from shared memory, its recorded checksum (None elsewhere): the client
    verifies what arrived (and the server verified it before sending, unless the get was
    ``checked`` by a client it trusts with the slab)."""

    sizes: list[int]
    sums: list[int | None] | None = None

    def to_header(self) -> Header:
        return without_none(Reply.to_header(self), "sums")

    def bad(self, blocks: list[object]) -> list[int]:
        """The indexes of blocks that the reply sent but that arrived as no block (None or
        False): those whose bytes did not match their checksum when they landed."""
        sums = self.sums or [None] * len(self.sizes)
        return [i for i, (size, csum, got) in enumerate(zip(self.sizes, sums, blocks,
                                                            strict=True))
                if size >= 0 and csum is not None and not got]

    @classmethod
    def from_header(cls, header: Header) -> Self:
        return cls(header["sizes"], header.get("sums"))


@dataclass(slots=True)
class Check(NsRequest):
    """The client's copy of these blocks, sent straight from the slab, failed its checksum:
    the server hashes its copies where they lie and drops those that fail (cause
    ``client``)."""

    op: ClassVar[str] = "check"


@dataclass(slots=True)
class CheckReply(Reply):
    """How many of the blocks failed on the server too and were dropped (also the reply of
    ``shm_check``)."""

    dropped: int


@dataclass(slots=True)
class Lookup(NsRequest):
    """The longest cached prefix of a hash chain and each of its blocks' tier."""

    op: ClassVar[str] = "lookup"


@dataclass(slots=True)
class LookupReply(Reply):
    prefix_blocks: int
    tiers: list[str]


@dataclass(slots=True)
class Prefetch(NsRequest):
    """Onboard blocks toward RAM in the background."""

    op: ClassVar[str] = "prefetch"


@dataclass(slots=True)
class PrefetchReply(Reply):
    accepted: int


@dataclass(slots=True)
class Pin(NsRequest):
    """Pin blocks for ``lease_s`` seconds (the server's default when None)."""

    op: ClassVar[str] = "pin"
    lease_s: float | None = None

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        return cls(*read_ns_hashes(header, limits), arg_float(header, "lease_s"))


@dataclass(slots=True)
class PinReply(Reply):
    pinned: list[bool] = field(default_factory=list)


@dataclass(slots=True)
class Release(NsRequest):
    """Drop the session owner's pins on blocks."""

    op: ClassVar[str] = "release"


@dataclass(slots=True)
class ReleaseReply(Reply):
    """How many pins were dropped (also the reply of ``shm_release``)."""

    released: int


@dataclass(slots=True)
class Delete(NsRequest):
    op: ClassVar[str] = "delete"


@dataclass(slots=True)
class DeleteReply(Reply):
    deleted: int
