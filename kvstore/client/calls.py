"""The client's single-frame calls as steps (see :mod:`kvstore.client.exchange`): each builds
its request message and reads its reply; both faces run them. Every function takes the
:class:`~kvstore.client.exchange.Link` first, whether it needs it or not, so that a face runs
any call the same way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvstore.client.errors import ProtocolError, error_from
from kvstore.client.exchange import Call, Link, Steps
from kvstore.namespace import Layout, Registered
from kvstore.protocol import (
    Delete,
    DeleteNamespace,
    DeleteNamespaceReply,
    DeleteReply,
    Flush,
    Health,
    HealthReply,
    Lookup,
    LookupReply,
    Pin,
    PinReply,
    Prefetch,
    Register,
    RegisterReply,
    Release,
    ReleaseReply,
    Stats,
    StatsReply,
)
from kvstore.protocol.health import StoreHealth
from kvstore.protocol.stats import StoreStats
from kvstore.types import BlockHash


def register(_: Link, name: str, block_bytes: int, layout: Layout | Mapping[str, Any],
             hash_algo: str, hash_seed: str | None, tenant: str | None) -> Steps[Registered]:
    """``layout``: the namespace's :class:`~kvstore.namespace.Layout` (a mapping of its
    fields is taken too; one that makes no layout raises the server's ``invalid_request``
    error, :class:`~kvstore.client.errors.BadRequestError`)."""
    try:
        lay = layout if isinstance(layout, Layout) else Layout(**layout)
    except (TypeError, ValueError) as exc:
        raise error_from("invalid_request", str(exc)) from None
    header, _blocks = yield Call(Register(name, block_bytes, lay, hash_algo, hash_seed, tenant))
    try:
        reply = RegisterReply.from_header(header)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"register answered with no namespace it could name: {exc}") \
            from None
    return Registered(reply.namespace, reply.created, reply.store_name)


def lookup(_: Link, ns: str, hashes: Sequence[BlockHash]) -> Steps[tuple[int, list[str]]]:
    header, _blocks = yield Call(Lookup(ns, list(hashes)))
    reply = LookupReply.from_header(header)
    return int(reply.prefix_blocks), list(reply.tiers)


def prefetch(_: Link, ns: str, hashes: Sequence[BlockHash], wait: bool) -> Steps[None]:
    yield Call(Prefetch(ns, list(hashes)), noreply=not wait)


def pin(_: Link, ns: str, hashes: Sequence[BlockHash], lease_s: float | None,
        wait: bool) -> Steps[list[bool]]:
    header, _blocks = yield Call(Pin(ns, list(hashes), lease_s), noreply=not wait)
    return [bool(x) for x in PinReply.from_header(header).pinned] if wait else []


def release(_: Link, ns: str, hashes: Sequence[BlockHash], wait: bool) -> Steps[int]:
    header, _blocks = yield Call(Release(ns, list(hashes)), noreply=not wait)
    return int(ReleaseReply.from_header(header).released) if wait else 0


def delete(_: Link, ns: str, hashes: Sequence[BlockHash]) -> Steps[int]:
    header, _blocks = yield Call(Delete(ns, list(hashes)))
    return int(DeleteReply.from_header(header).deleted)


def flush(_: Link) -> Steps[None]:
    yield Call(Flush())


def stats(_: Link) -> Steps[StoreStats]:
    header, _blocks = yield Call(Stats())
    return StatsReply.from_header(header).stats


def health(_: Link) -> Steps[StoreHealth]:
    header, _blocks = yield Call(Health())
    return HealthReply.from_header(header).health


def delete_namespace(_: Link, name: str) -> Steps[int]:
    header, _blocks = yield Call(DeleteNamespace(name))
    return int(DeleteNamespaceReply.from_header(header).blocks)
