"""Connector counters in vLLM's ``KVConnectorStats`` shape, so they travel with vLLM's own
stats (worker to scheduler to logger) and print in its periodic "KV Transfer metrics" line.

Each side counts what it sees: the scheduler lookups and hit tokens, the workers loaded and
saved blocks, bytes, errors and time. vLLM aggregates the per-step objects of all sides with
:meth:`aggregate` and reduces an interval with :meth:`reduce`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

_DOCS: dict[str, str] = {
    "lookups": "requests looked up in the store",
    "hit_tokens": "tokens the store supplied beyond vLLM's own prefix cache",
    "loaded_blocks": "blocks copied from the store into KV pages",
    "load_errors": "blocks that failed to load and were recomputed",
    "saved_blocks": "blocks stored",
    "save_errors": "blocks that could not be stored (a future miss, not an error)",
    "loaded_bytes": "bytes loaded",
    "saved_bytes": "bytes stored",
    "load_s": "seconds spent fetching and copying loads",
    "save_s": "seconds spent copying out and storing saves",
    "window_skipped_bytes": "bytes of sliding-window blocks not stored because no later hit "
    "can use them (what storing every block of every layer would have added)",
}
COUNTERS: tuple[str, ...] = tuple(_DOCS)


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


class KVStorePromMetrics(KVConnectorPromMetrics):
    """The counters as Prometheus counters ``vllm:kvstore_<name>`` (per engine), next to
    vLLM's own metrics on its ``/metrics`` endpoint and in ``LLM.get_metrics()``."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, dict[int, Any]] = {}
        for name in COUNTERS:
            counter = self._counter_cls(
                name=f"vllm:kvstore_{name}",
                documentation=f"KVStoreConnector: {_DOCS[name]}",
                labelnames=labelnames,
            )
            self._counters[name] = {
                idx: counter.labels(*values) for idx, values in per_engine_labelvalues.items()
            }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, per_engine in self._counters.items():
            value = transfer_stats_data.get(name, 0)
            if value:
                per_engine[engine_idx].inc(value)
