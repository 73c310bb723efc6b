"""Messages of the block ops over the socket: ``put``, ``get``, ``lookup``, ``prefetch``,
``pin``, ``release``, ``delete``.

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
    op: ClassVar[str] = "get"


@dataclass(slots=True)
class GetReply(Reply):
    """Each block's size in the payload, -1 for a miss; ``sums``, where the server sent a
    block straight from shared memory, its recorded checksum (None elsewhere): the bytes
    were verified before sending, the client verifies what arrived."""

    sizes: list[int]
    sums: list[int | None] | None = None

    def to_header(self) -> Header:
        return without_none(Reply.to_header(self), "sums")

    @classmethod
    def from_header(cls, header: Header) -> Self:
        return cls(header["sizes"], header.get("sums"))


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
