"""Connector counters in vLLM's ``KVConnectorStats`` shape, so they travel with vLLM's own
stats (worker to scheduler to logger) and print in its periodic "KV Transfer metrics" line.

Each side counts what it sees: the scheduler lookups and hit tokens, the workers loaded and
saved blocks, bytes, errors and time. vLLM aggregates the per-step objects of all sides with
:meth:`aggregate` and reduces an interval with :meth:`reduce`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

COUNTERS: tuple[str, ...] = (
    "lookups",  # requests looked up in the store
    "hit_tokens",  # tokens the store supplied beyond vLLM's own prefix cache
    "loaded_blocks",
    "load_errors",  # blocks that failed to load and were recomputed
    "saved_blocks",
    "save_errors",  # blocks that could not be stored (dropped: a future miss, not an error)
    "loaded_bytes",
    "saved_bytes",
    "load_s",  # seconds spent fetching and copying loads
    "save_s",  # seconds spent copying out and storing saves
)


@dataclass
class KVStoreConnectorStats(KVConnectorStats):
    """Counters of one interval; ``data`` maps each name in :data:`COUNTERS` to a number."""

    def __post_init__(self) -> None:
        for name in COUNTERS:
            self.data.setdefault(name, 0)

    def add(self, name: str, value: float = 1) -> None:
        self.data[name] += value

    def reset(self) -> None:
        for name in COUNTERS:
            self.data[name] = 0

    def take(self) -> KVStoreConnectorStats | None:
        """A copy of this interval's counters, or None when nothing happened; then reset."""
        if self.is_empty():
            return None
        out = KVStoreConnectorStats(data=dict(self.data))
        self.reset()
        return out

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name in COUNTERS:
            self.data[name] += other.data.get(name, 0)
        return self

    def reduce(self) -> dict[str, int | float]:
        d = self.data
        out: dict[str, int | float] = {
            name: d[name] for name in COUNTERS if name not in ("load_s", "save_s")
        }
        out["load_ms"] = round(d["load_s"] * 1e3, 3)
        out["save_ms"] = round(d["save_s"] * 1e3, 3)
        if d["load_s"] > 0:
            out["load_MBps"] = round(d["loaded_bytes"] / d["load_s"] / 1e6, 1)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get(name) for name in COUNTERS)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)
