"""``KVStoreConnector``: kvstore as vLLM's external KV cache (vLLM 0.32, ``KVConnectorBase_V1``).

Load it with::

    kv_transfer_config={"kv_connector": "KVStoreConnector",
                        "kv_connector_module_path": "connectors.vllm",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"kvstore_url": "http://127.0.0.1:8000"}}

vLLM builds one instance in the scheduler process (role SCHEDULER) and one per worker (role
WORKER); this class only routes each hook to :class:`~connectors.vllm.scheduler_side.
SchedulerSide` or :class:`~connectors.vllm.worker_side.WorkerSide` (built by
:mod:`connectors.vllm.sides`).

Scheduler side: ``on_new_request`` (prefetch), ``get_num_new_matched_tokens`` (lookup; the hit
beyond vLLM's own prefix cache is an asynchronous load), ``update_state_after_alloc`` (plan
and pin the load), ``build_connector_meta`` (this step's loads and saves),
``update_connector_output`` (unpin finished loads), ``request_finished``.
Worker side: ``register_kv_caches``, ``start_load_kv`` / ``wait_for_layer_load`` (loads),
``save_kv_layer`` / ``wait_for_save`` (saves), ``get_finished``,
``get_block_ids_with_load_errors``, ``get_kv_connector_stats``, ``shutdown``.

Failure rule: kvstore is a cache. When it is down, restarting or has lost a block, vLLM
computes the KV itself; the connector never raises into the engine for that, and never hands
it bytes it did not verify came whole from the store.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from connectors.vllm.config import ConnectorConfig
from connectors.vllm.layout import hash_recipe
from connectors.vllm.metadata import KVStoreConnectorMetadata
from connectors.vllm.segments import segments_from_vllm
from connectors.vllm.sides import scheduler_side, tp_rank, worker_sides
from connectors.vllm.stats import KVStoreConnectorStats, KVStorePromMetrics

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from connectors.vllm.scheduler_side import SchedulerSide
    from connectors.vllm.worker_side import WorkerSide

# Under "vllm." so that records show in vLLM's own log format and level.
logger = logging.getLogger(f"vllm.{__name__}")

# kvstore tiers -> vLLM's hit-source labels (RAM tiers are "host", the rest "disk").
_TIER_SOURCE = {"device": CacheHitSource.HOST, "host": CacheHitSource.HOST}


class KVStoreConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM ``KVConnectorBase_V1`` backed by a kvstore server (see the module docstring).
    ``SupportsHMA``: hybrid models keep vLLM's hybrid KV cache manager (each sliding-window
    layer holds only its window), and each kind of attention is a segment of its own."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = self._kv_transfer_config
        cfg = ConnectorConfig.from_extra(ktc.kv_connector_extra_config or {})
        algo, seed = hash_recipe(vllm_config.cache_config.prefix_caching_hash_algo, os.environ)
        rank = tp_rank() if role == KVConnectorRole.WORKER else 0
        segments = segments_from_vllm(vllm_config, kv_cache_config, rank, cfg.window_stride)
        self._cfg = cfg
        self._num_blocks = int(kv_cache_config.num_blocks)
        self._hybrid = len(segments) > 1
        self._scheduler: SchedulerSide | None = None
        self._workers: list[WorkerSide] = []
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = scheduler_side(vllm_config, ktc, cfg, segments, algo, seed)
        else:
            self._workers = worker_sides(cfg, segments, rank, algo, seed)
            self._layers = [set(seg.layer_groups()) for seg in segments]

    # -- properties vLLM reads ---------------------------------------------------------------

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a save dropped by preemption is a future miss, not an error.
        return False

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return KVStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return KVStoreConnectorStats(data=dict(data) if data else {})

    # -- scheduler side ----------------------------------------------------------------------

    @property
    def _sched(self) -> SchedulerSide:
        assert self._scheduler is not None, "scheduler-side hook called on a worker"
        return self._scheduler

    def on_new_request(self, request: Request) -> None:
        self._sched.on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        n = self._sched.get_num_new_matched_tokens(request, num_computed_tokens)
        return n, n > 0 and self._sched.load_async

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        if num_external_tokens == 0:
            return {}
        tiers = self._sched.hit_tiers(request, num_external_tokens)
        if not tiers:
            return {CacheHitSource.EXTERNAL_UNSPECIFIED: num_external_tokens}
        # The outermost tier any block came from labels the whole hit, as vLLM's do.
        sources = {_TIER_SOURCE.get(t, CacheHitSource.DISK) for t in tiers}
        return {CacheHitSource.outermost(sources): num_external_tokens}

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._sched.build_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._sched.update_connector_output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._sched.request_finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._sched.request_finished(request)

    # -- worker side -------------------------------------------------------------------------

    @property
    def _work(self) -> list[WorkerSide]:
        assert self._workers, "worker-side hook called on the scheduler"
        return self._workers

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        for worker, layers in zip(self._work, self._layers, strict=True):
            worker.register_kv_caches(
                {name: t for name, t in kv_caches.items() if name in layers}, self._num_blocks)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if isinstance(meta, KVStoreConnectorMetadata) and meta.loads:
            for i, worker in enumerate(self._work):
                worker.start_load(meta.of_segment(i))

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are asynchronous: their requests run only after the copy finished.
        return

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        # Whole blocks across all layers are one stored object: copied in wait_for_save.
        return

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        if isinstance(meta, KVStoreConnectorMetadata) and meta.saves:
            for i, worker in enumerate(self._work):
                worker.save(meta.of_segment(i))

    def get_finished(
        self, finished_req_ids: set[str]
    ) -> tuple[set[str] | None, set[str] | None]:
        done = set().union(*(w.get_finished() for w in self._work))
        return None, (done or None)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Finished loads; for a hybrid model also the requests whose load failed (vLLM can
        map failed pages back to requests only for one KV cache group)."""
        results = super().get_transfer_results(finished_req_ids)
        if self._hybrid:
            failed = set().union(*(w.take_failed_requests() for w in self._work))
            results.failed_recving = failed
            results.finished_recving |= failed
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = set().union(*(w.take_load_errors() for w in self._work))
        if self._hybrid:
            return set()  # reported per request by get_transfer_results
        for w in self._work:
            w.take_failed_requests()
        return errors

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._workers:
            stats = [st for w in self._workers if (st := w.take_stats()) is not None]
            for more in stats[1:]:
                stats[0].aggregate(more)
            return stats[0] if stats else None
        if self._scheduler is not None:
            return self._scheduler.take_stats()
        return None

    def shutdown(self) -> None:
        for worker in self._workers:
            worker.shutdown(self._cfg.timeout_s)
        if self._scheduler is not None:
            self._scheduler.close()

