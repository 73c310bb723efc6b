"""What every data-plane op needs: the store, the settings, the worker pool, the calling
session, and the two ways an op calls the store (in a worker thread, or here when it does not
block)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvstore.errors import WouldBlock
from kvstore.namespace import Namespace
from kvstore.protocol import Buffer, Reply
from kvstore.store import StoreAPI
from kvstore.types import BlockHash
from server.auth import Principal
from server.dataplane.budget import ByteBudget
from server.settings import ServerSettings
from server.tenant_view import resolve

if TYPE_CHECKING:
    from server.peer_fill import PeerFill

Answer = tuple[Reply, list[Buffer]]
Handler = Callable[[Any, Any, memoryview], Awaitable[Answer]]


@dataclass(slots=True)
class Session:
    """One connection's identity: its principal (None until ``hello`` when auth is on)."""

    principal: Principal | None
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    reply_bytes: int = 0  # budget bytes the reply being built holds (given back once sent)
    unix: bool = False  # a Unix-socket connection: descriptors can travel with replies
    send_fds: list[int] = field(default_factory=list)  # to attach to the next reply
    # the reply's payload borrows pinned memory: called once it is sent (or cannot be)
    after_send: Callable[[], Awaitable[None]] | None = None
    prefetching: int = 0  # hashes of this connection's prefetches not yet read by the store
    from_peer: bool = False  # another node of the cluster reading: serve what is held here

    @property
    def tenant(self) -> str | None:
        """Whom the session's pins are charged to: its principal's tenant (None for the
        admin, whose pins no quota limits)."""
        return self.principal.tenant if self.principal is not None else None


class OpsContext:
    """The store and settings the op handlers share, and how they reach the store."""

    def __init__(self, store: StoreAPI, settings: ServerSettings,
                 run: Callable[..., Awaitable[Any]], fill: PeerFill | None = None) -> None:
        self.store = store
        self.settings = settings
        self.run = run  # run(fn, *args) in the worker pool
        self.fill = fill  # reads from the cluster's other nodes (None: a node alone)
        self.budget = ByteBudget(settings.frame_budget_bytes)  # frames and replies in memory

    def ns(self, session: Session, name: str) -> Namespace:
        """The namespace the session's principal calls ``name``, under the store's name;
        ``UnknownNamespaceError`` if it has none (see :func:`server.tenant_view.resolve`)."""
        assert session.principal is not None  # dispatch refuses these ops before hello
        return resolve(self.store, session.principal, name)

    async def reach(self, session: Session, ns: Namespace, hashes: list[BlockHash]) -> None:
        """Bring here first the blocks of ``hashes`` that this node lacks and other nodes of
        its cluster hold (:mod:`server.peer_fill`); nothing for a node alone, nor for another
        node's read (which asks only what the index says this node holds: two nodes whose
        records point at each other must not wait on each other)."""
        if self.fill is not None and not session.from_peer:
            await self.fill.before_read(self.run, ns, hashes)

    async def now(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, nowait=True)`` here on the event loop, or ``fn(*args)`` in a worker
        thread if that would block."""
        return await nowait_first(self.run, fn, *args, **kwargs)


async def nowait_first(run: Callable[..., Awaitable[Any]], fn: Callable[..., Any], *args: Any,
                       **kwargs: Any) -> Any:
    """``fn(*args, nowait=True)`` here on the event loop, or ``fn(*args)`` through ``run`` (in
    a worker thread) if that would block."""
    try:
        return fn(*args, nowait=True, **kwargs)
    except WouldBlock:
        return await run(lambda: fn(*args, **kwargs))
