"""Who hears of every change in where the store's blocks lie (a cluster node publishing its
index, for one). The ledger tells its sink each changed block's tier mask after the change
(bit ``t``: tier ``t`` holds a copy; 0: the block is gone), under the store lock: a sink must
only note the change and return."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvstore.types import BlockKey


class PlacementSink(Protocol):
    def placed(self, changes: Sequence[tuple[BlockKey, int]]) -> None:
        """Each block's tier mask now (0: gone)."""
        ...
