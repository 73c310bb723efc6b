"""The base of every data-plane message: a request knows its op and both directions of its
header; a reply knows its fields.

A request is a ``@dataclass(slots=True)`` subclass of :class:`Request` naming its ``op``; its
header is ``{"op": op, field: value, ...}`` in field order (the frame's ``id`` and ``noreply``
are added by the connection). :meth:`Request.from_header` validates a received header and
raises the :class:`~kvstore.protocol.frame.FrameError` the server answers with. A reply's
header is its fields; clients read it with :meth:`Reply.from_header`, which trusts the server.
The op table (:mod:`kvstore.protocol.ops`) finds a request class by its op name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Self

from kvstore.protocol.fields import arg_hashes, arg_str
from kvstore.types import BlockHash

Header = dict[str, Any]


class Limits(NamedTuple):
    """What a received header is checked against: the server's batch limit and the length of
    the frame's payload (which a put's ``sizes`` must add up to)."""

    max_batch: int
    payload_len: int = 0


class Request:
    """One op's arguments. Class attributes say how dispatch treats it."""

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]]
    op: ClassVar[str]
    before_hello: ClassVar[bool] = False  # may come before the session is authenticated
    takes_payload: ClassVar[bool] = False  # block bytes follow the header
    needs_shm: ClassVar[bool] = False  # only where the server offers shared memory

    def to_header(self) -> Header:
        return {"op": self.op, **{name: getattr(self, name) for name in self.__match_args__}}

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        """The message in ``header``; raises FrameError naming the first bad field."""
        return cls()


@dataclass(slots=True)
class NsRequest(Request):
    """The shape of most ops: a namespace and a batch of block hashes (subclasses name the
    op and may add fields)."""

    ns: str
    hashes: list[BlockHash]

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        return cls(*read_ns_hashes(header, limits))


def read_ns_hashes(header: Header, limits: Limits) -> tuple[str, list[BlockHash]]:
    return arg_str(header, "ns"), arg_hashes(header, limits.max_batch)


class Reply:
    """One op's result fields."""

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]]

    def to_header(self) -> Header:
        return {name: getattr(self, name) for name in self.__match_args__}

    @classmethod
    def from_header(cls, header: Header) -> Self:
        return cls(*(header[name] for name in cls.__match_args__))
