"""Messages of the shared-memory ops: only control frames cross the socket, block bytes are
copied in and out of the server's host slab at the extents these replies hand out.

An extent list locates one block: ``[[offset, length], ...]``; a staged place is the same,
named in ``shm_put`` by its first offset. See ``docs/operations.md`` for the whole path.

Fencing: every reply that hands out extents also gives each block's generation (``gens``,
None where the extents are None); ``shm_commit`` and ``shm_put`` take them back and the server
refuses a block whose slots were freed since. A client reads the slab's generation words
itself to check a copy (see :mod:`kvstore.tiers.slots`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, cast

from kvstore.protocol.fields import (
    arg_bool,
    arg_float,
    arg_int,
    arg_ints,
    arg_str,
    arg_sums,
    without_none,
)
from kvstore.protocol.frame import FrameError
from kvstore.protocol.message import Header, Limits, NsRequest, Reply, Request, read_ns_hashes

Extents = list[list[int]]  # [[offset, length], ...] of one block
Gens = list[int | None]  # one generation per block (None where it has no extents)
Sums = list[int | None]  # one checksum per block (xxh3-64; None where unknown)


class FencedReply(Reply):
    """A reply that hands out extents (in field ``_places``) with their generations
    (``gens``); from a server that sends none, every generation is None (no fencing)."""

    __slots__ = ()
    _places: ClassVar[str]

    @classmethod
    def from_header(cls, header: Header) -> Self:
        optional = ("gens", "sums")
        fields = {name: header[name] for name in cls.__match_args__ if name not in optional}
        count = len(fields[cls._places])
        for name in optional:
            if name in cls.__match_args__:
                got = header.get(name)  # absent (an older server): unknown for every block
                fields[name] = [None] * count if got is None else got
        made: Self = cast(Any, cls)(**fields)
        return made


def arg_gens(header: Header, key: str, count: int) -> Gens | None:
    """An optional list of ``count`` generations (non-negative integers or None)."""
    value = header.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != count or not all(
            g is None or (isinstance(g, int) and not isinstance(g, bool) and g >= 0)
            for g in value):
        raise FrameError("bad_request",
                         f"field {key!r} must be a list of {count} generations (int or nil)")
    return value


def refuse_durable(header: Header) -> None:
    """Shared-memory writes are never durable: a ``durable`` field must be absent or false,
    the same strict boolean that ``put`` reads, never silently ignored."""
    if arg_bool(header, "durable"):
        raise FrameError("bad_request", "field 'durable': shared-memory puts are never "
                                        "durable; send a durable put with 'put'")


class ShmRequest(NsRequest):
    """An op of the shared-memory path: refused where the server offers no slab."""

    __slots__ = ()
    needs_shm: ClassVar[bool] = True


@dataclass(slots=True)
class LeasedRequest(ShmRequest):
    """A namespace, hashes and the lease of what it pins or reserves."""

    lease_s: float | None = None

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        return cls(*read_ns_hashes(header, limits), arg_float(header, "lease_s"))


@dataclass(slots=True)
class ShmReserve(LeasedRequest):
    """Reserve slab places for new blocks (None for a block stored already)."""

    op: ClassVar[str] = "shm_reserve"

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        refuse_durable(header)
        return cls(*read_ns_hashes(header, limits), arg_float(header, "lease_s"))


@dataclass(slots=True)
class ExtentsReply(FencedReply):
    """Per block its extents, or None, and its generation (reply of ``shm_reserve`` and
    ``shm_acquire``); for a read, its recorded checksum (``sums``), which the client checks
    its copy against."""

    extents: list[Extents | None]
    gens: Gens = field(default_factory=list)
    sums: Sums = field(default_factory=list)
    _places: ClassVar[str] = "extents"


@dataclass(slots=True)
class ShmCommit(ShmRequest):
    """Publish reserved blocks once their bytes are in the slab (replies a ``PutReply``);
    with ``gens`` (as ``shm_reserve`` gave them) a block whose slots moved is refused, and
    with ``sums`` (the writer's checksums) one whose bytes in the slab differ."""

    op: ClassVar[str] = "shm_commit"
    gens: Gens | None = None
    sums: Sums | None = None

    def to_header(self) -> Header:
        return without_none(Request.to_header(self), "gens", "sums")

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        refuse_durable(header)
        ns, hashes = read_ns_hashes(header, limits)
        return cls(ns, hashes, arg_gens(header, "gens", len(hashes)),
                   arg_sums(header, len(hashes)))


@dataclass(slots=True)
class ShmAbort(ShmRequest):
    op: ClassVar[str] = "shm_abort"


@dataclass(slots=True)
class AbortReply(Reply):
    aborted: int


@dataclass(slots=True)
class ShmAcquire(LeasedRequest):
    """Pin blocks for reading and hand out their extents (until ``shm_release``)."""

    op: ClassVar[str] = "shm_acquire"


@dataclass(slots=True)
class ShmRelease(ShmRequest):
    """Drop read pins, or with ``grant`` the pins of an ``shm_lookup`` (replies a
    ``ReleaseReply``)."""

    op: ClassVar[str] = "shm_release"
    grant: bool = False

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        return cls(*read_ns_hashes(header, limits), arg_bool(header, "grant"))


@dataclass(slots=True)
class ShmStage(Request):
    """Stage up to ``count`` anonymous places for later ``shm_put`` frames."""

    op: ClassVar[str] = "shm_stage"
    needs_shm: ClassVar[bool] = True
    ns: str
    count: int

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        refuse_durable(header)
        ns = arg_str(header, "ns")
        count = arg_int(header, "count")
        if not 0 <= count <= limits.max_batch:
            raise FrameError("bad_request", f"'count' must be 0-{limits.max_batch}")
        return cls(ns, count)


@dataclass(slots=True)
class StageReply(FencedReply):
    staged: list[Extents]
    gens: Gens = field(default_factory=list)
    _places: ClassVar[str] = "staged"


@dataclass(slots=True)
class ShmPut(ShmRequest):
    """Publish blocks written into staged places (named by their first offset), and stage as
    many places again."""

    op: ClassVar[str] = "shm_put"
    places: list[int]
    gens: Gens | None = None  # of the places, as staged
    sums: Sums | None = None  # the writer's checksums, as for shm_commit

    def to_header(self) -> Header:
        return without_none(Request.to_header(self), "gens", "sums")

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        refuse_durable(header)
        ns, hashes = read_ns_hashes(header, limits)
        return cls(ns, hashes, arg_ints(header, "places", len(hashes)),
                   arg_gens(header, "gens", len(hashes)), arg_sums(header, len(hashes)))


@dataclass(slots=True)
class ShmPutReply(FencedReply):
    """What the put did, the places it used (first offsets) and the newly staged ones."""

    stored: int
    existing: int
    refused: int
    used: list[int]
    staged: list[Extents]
    gens: Gens = field(default_factory=list)  # of the newly staged places
    _places: ClassVar[str] = "staged"


@dataclass(slots=True)
class ShmLookup(LeasedRequest):
    """``lookup``, and each block of the hit that the host tier holds pinned for reading by
    other processes (a grant; ``shm_release`` with ``grant`` drops it)."""

    op: ClassVar[str] = "shm_lookup"


@dataclass(slots=True)
class ShmLookupReply(FencedReply):
    prefix_blocks: int
    tiers: list[str]
    extents: list[Extents | None]
    gens: Gens = field(default_factory=list)
    sums: Sums = field(default_factory=list)
    _places: ClassVar[str] = "extents"


@dataclass(slots=True)
class ShmCheck(ShmRequest):
    """A reader's copy of these blocks out of the slab failed its checksum: the server hashes
    its copies where they lie and drops those that fail (replies a
    :class:`~kvstore.protocol.blocks.CheckReply`; ``check`` is the same for a socket get)."""

    op: ClassVar[str] = "shm_check"


def first_offsets(places: list[Any]) -> list[int]:
    """How ``shm_put`` names staged places: by the first offset of each."""
    return [int(place[0][0]) for place in places]


@dataclass(slots=True)
class ShmMap(Request):
    """Ask for the host slab itself: the reply comes with the slab's file descriptor attached
    (``SCM_RIGHTS``), so it works only over the Unix socket, after ``hello``, and only for a
    principal the server trusts with the whole slab (see ``docs/operations.md``, Security)."""

    op: ClassVar[str] = "shm_map"
    needs_shm: ClassVar[bool] = True


@dataclass(slots=True)
class ShmMapReply(Reply):
    """How to map the descriptor that comes with this reply: the slab's size and slot size,
    and where the slots' generation words start."""

    size: int
    slot_bytes: int
    gen_offset: int
