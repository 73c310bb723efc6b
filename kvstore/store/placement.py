"""What a cluster node watches in its store: every change in where the store's blocks lie
(:class:`PlacementSink`: the ledger tells it each changed block's tier mask after the change,
bit ``t`` for tier ``t``, 0 when the block is gone, under the store lock, so a sink must only
note the change and return), and every namespace registered or deleted
(:class:`NamespaceClaims`: asked before a registration, out of every lock, so that one
namespace name means one definition across the cluster)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvstore.namespace import Namespace
from kvstore.types import BlockKey


class PlacementSink(Protocol):
    def placed(self, changes: Sequence[tuple[BlockKey, int]]) -> None:
        """Each block's tier mask now (0: gone)."""
        ...


class NamespaceClaims(Protocol):
    def claim(self, ns: Namespace) -> None:
        """Raise :class:`~kvstore.errors.NamespaceConflictError` if another node holds a
        namespace of that name with another definition; else note that this node holds it."""
        ...

    def release(self, name: str) -> None:
        """This node no longer holds namespace ``name``."""
        ...
