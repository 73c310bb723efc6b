"""Messages of the session and namespace ops: ``hello``, ``ping``, ``register``,
``namespaces``, ``stats``, ``health``, ``flush``, ``delete_namespace``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from kvstore.namespace import Layout, Namespace
from kvstore.protocol.fields import arg_int, arg_str
from kvstore.protocol.frame import FrameError
from kvstore.protocol.health import StoreHealth
from kvstore.protocol.info import ServerInfo
from kvstore.protocol.message import Header, Limits, Reply, Request
from kvstore.protocol.stats import StoreStats

MAX_OWNER_CHARS = 128
# An owner id names the client's pins and reservations. The server holds some of its own under
# the client's owner plus a suffix ("#read", "#grant"): a client whose owner could end in one
# would name, and on closing drop, another client's pins. So owners are plain printable text
# without "#".
_OWNER_CHARS = re.compile(r"[!-~]*")
_NOT_INFO = ("owner", "id", "ok")  # the keys of a hello reply that are not server info


@dataclass(slots=True)
class Hello(Request):
    """First frame of a connection: the token (when auth is on) and the client's ``owner`` id,
    which all its connections share (pins and reservations are held under it)."""

    op: ClassVar[str] = "hello"
    before_hello: ClassVar[bool] = True
    token: str | None = None
    owner: str | None = None

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        token = header.get("token")
        if token is not None and not isinstance(token, str):
            raise FrameError("bad_request", "field 'token' must be a string")
        owner = arg_str(header, "owner", optional=True)
        if owner is not None and len(owner) > MAX_OWNER_CHARS:
            raise FrameError("bad_request",
                             f"field 'owner' is longer than {MAX_OWNER_CHARS} characters")
        if owner is not None and ("#" in owner or not _OWNER_CHARS.fullmatch(owner)):
            raise FrameError("bad_request", "field 'owner' may hold only printable ASCII "
                             "characters other than '#' and space")
        return cls(token, owner)


@dataclass(slots=True)
class HelloReply(Reply):
    """The server's ``/v1/info`` (``info``, its fields beside the owner's in the header) and
    the owner id the session got."""

    info: ServerInfo
    owner: str

    @property
    def instance(self) -> str:
        return self.info.instance

    def to_header(self) -> Header:
        return {**self.info.model_dump(), "owner": self.owner}

    @classmethod
    def from_header(cls, header: Header) -> Self:
        info = {k: v for k, v in header.items() if k not in _NOT_INFO}
        return cls(ServerInfo.model_validate(info), str(header.get("owner", "")))


@dataclass(slots=True)
class Ping(Request):
    op: ClassVar[str] = "ping"


@dataclass(slots=True)
class Register(Request):
    """Register (or confirm) a namespace; the server builds and checks the definition (the
    layout checks itself as it is read: a bad one is ``invalid_request``)."""

    op: ClassVar[str] = "register"
    name: str
    block_bytes: int
    layout: Layout = field(default_factory=Layout)
    hash_algo: Any = "sha256"
    hash_seed: Any = None
    tenant: Any = None

    def to_header(self) -> Header:
        return {**Request.to_header(self), "layout": self.layout.to_dict()}

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        doc = header.get("layout") or {}
        if not isinstance(doc, dict):
            raise FrameError("bad_request", "field 'layout' must be a map")
        try:
            layout = Layout(**doc)
        except (TypeError, ValueError) as exc:
            raise FrameError("invalid_request", str(exc)) from None
        return cls(arg_str(header, "name"), arg_int(header, "block_bytes"), layout,
                   header.get("hash_algo", "sha256"), header.get("hash_seed"),
                   header.get("tenant"))


@dataclass(slots=True)
class RegisterReply(Reply):
    """Whether the call created the namespace, the namespace as its caller names it, and the
    name the store knows it by (``tenant~name`` for a tenant's: what a cluster's block index
    and a router that reads it use; "" from a server too old to say). Reading one that is not
    a valid namespace raises ``ValueError`` or ``TypeError``."""

    created: bool
    namespace: Namespace
    store_name: str = ""

    def to_header(self) -> Header:
        return {"created": self.created, "namespace": self.namespace.to_dict(),
                "store_name": self.store_name}

    @classmethod
    def from_header(cls, header: Header) -> Self:
        name = header.get("store_name")
        return cls(bool(header.get("created")), Namespace.from_dict(header.get("namespace") or {}),
                   name if isinstance(name, str) else "")


@dataclass(slots=True)
class Namespaces(Request):
    op: ClassVar[str] = "namespaces"


@dataclass(slots=True)
class NamespacesReply(Reply):
    """The namespaces the caller sees, as it names them."""

    namespaces: list[Namespace]

    def to_header(self) -> Header:
        return {"namespaces": [ns.to_dict() for ns in self.namespaces]}

    @classmethod
    def from_header(cls, header: Header) -> Self:
        return cls([Namespace.from_dict(doc) for doc in header.get("namespaces") or []])


@dataclass(slots=True)
class Stats(Request):
    op: ClassVar[str] = "stats"


@dataclass(slots=True)
class StatsReply(Reply):
    """The caller's view of the store's counters, as ``/v1/stats`` answers it."""

    stats: StoreStats

    def to_header(self) -> Header:
        return {"stats": self.stats.doc()}

    @classmethod
    def from_header(cls, header: Header) -> Self:
        return cls(StoreStats.model_validate(header["stats"]))


@dataclass(slots=True)
class Health(Request):
    op: ClassVar[str] = "health"


@dataclass(slots=True)
class HealthReply(Reply):
    """The caller's view of the store's health, as ``/healthz`` with a token answers it."""

    health: StoreHealth

    def to_header(self) -> Header:
        return {"health": self.health.doc()}

    @classmethod
    def from_header(cls, header: Header) -> Self:
        return cls(StoreHealth.model_validate(header["health"]))


@dataclass(slots=True)
class Flush(Request):
    """Make every block stored so far durable on the persistent tiers."""

    op: ClassVar[str] = "flush"


@dataclass(slots=True)
class Ack(Reply):
    """The empty reply of ``ping`` and ``flush``."""


@dataclass(slots=True)
class DeleteNamespace(Request):
    """Forget a namespace and remove its blocks from every tier (a tenant: only its own)."""

    op: ClassVar[str] = "delete_namespace"
    name: str

    @classmethod
    def from_header(cls, header: Header, limits: Limits) -> Self:
        return cls(arg_str(header, "name"))


@dataclass(slots=True)
class DeleteNamespaceReply(Reply):
    blocks: int  # how many blocks the namespace held
