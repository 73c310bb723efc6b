"""Messages of the block ops over the socket: ``put``, ``get``, ``check``, ``lookup``,
``prefetch``, ``pin``, ``release``, ``delete``.

Block bytes never go in a header: a put's payload and a get reply's payload carry them back
to back, their sizes in ``sizes`` (``-1`` for a miss in a get reply).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Self

from kvstore.protocol.fields import arg_bool, arg_float, arg_sizes, arg_sums, without_none
from kvstore.protocol.message import Header, Limits, NsRequest, Reply, read_ns_hashes


@dataclass(slots=True)
class Put(NsRequest):
    """Store the payload's blocks; with ``durable`` the reply waits until they are on disk.
    ``sums``: the writer's checksum of each block (xxh3-64); a block whose bytes arrive
    otherwise is refused."""

    op: ClassVar[str] = "put"
    takes_payload: ClassVar[bool] = True
    sizes: list[int]
    durable: bool = False
    sums: list[int | None] | None = None

    def to_header(self) -> Header:
        return without_none(NsRequest.to_header(self), "sums")

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        ns, hashes = read_ns_hashes(header, limits)
        sizes = arg_sizes(header, len(hashes), limits.payload_len)
        return cls(ns, hashes, sizes, arg_bool(header, "durable"), arg_sums(header, len(hashes)))


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
