"""Each role's half of the connector, built from vLLM's config: in the scheduler process one
:class:`~connectors.vllm.scheduler_side.SchedulerSide` over a
:class:`~connectors.vllm.store_link.StoreLink` per segment of the KV cache, in a worker one
:class:`~connectors.vllm.worker_side.WorkerSide` per segment."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from connectors.vllm.scheduler_side import SchedulerSide
from connectors.vllm.segments import Segment, cannot_resume
from connectors.vllm.store_link import StoreLink
from connectors.vllm.worker_side import WorkerSide
from kvstore.keys import BlockHasher

if TYPE_CHECKING:
    from collections.abc import Callable

    from vllm.config import KVTransferConfig, VllmConfig

    from connectors.vllm.config import ConnectorConfig

# Under "vllm." so that records show in vLLM's own log format and level.
logger = logging.getLogger(f"vllm.{__name__}")


def link_factory(
    cfg: ConnectorConfig, algo: str, seed: str | None,
) -> Callable[[Segment], StoreLink]:
    """A new link to the store for a segment, in the segment's own namespace."""

    def make_link(seg: Segment) -> StoreLink:
        lay = seg.layout
        return StoreLink(cfg, lay.namespace(cfg.namespace), lay.block_bytes,
                         lay.to_store_layout(), algo, seed)

    return make_link


def scheduler_side(
    vllm_config: VllmConfig, ktc: KVTransferConfig, cfg: ConnectorConfig,
    segments: list[Segment], algo: str, seed: str | None,
) -> SchedulerSide:
    """The scheduler's half: registers every segment's namespace (an unreachable store is only
    logged) and loads only where vLLM can resume a request from loaded KV."""
    if ktc.kv_load_failure_policy == "fail" and cfg.on_load_error == "recompute":
        # vLLM's default fails a request whose load broke; for a cache, a lost block
        # is a miss, so recompute it unless the user asked for "fail" here too.
        ktc.kv_load_failure_policy = "recompute"
    make_link = link_factory(cfg, algo, seed)
    links = [(seg, make_link(seg)) for seg in segments]
    no_loads = cannot_resume(vllm_config)
    if no_loads and ktc.is_kv_consumer:
        logger.warning("KVStoreConnector: loads are off for this engine: %s; it only "
                       "stores its KV", no_loads)
    for _, link in links:
        if not link.register():
            logger.warning("kvstore at %s unreachable at start; will retry", cfg.url)
    side = SchedulerSide(
        links if len(segments) > 1 or segments[0].sliding else links[0][1],
        segments[0].layout.block_size,
        BlockHasher(algo, seed, segments[0].layout.block_size),
        load=ktc.is_kv_consumer and not no_loads,
        save=ktc.is_kv_producer,
        prefetch=cfg.prefetch,
        load_async=cfg.load_mode == "async",
    )
    logger.info(
        "KVStoreConnector: kvstore %s, namespace%s %s (%s, seed %s)",
        cfg.url, "s" if len(links) > 1 else "",
        ", ".join(link.namespace for _, link in links),
        algo, "PYTHONHASHSEED" if seed else "default",
    )
    return side


def worker_sides(cfg: ConnectorConfig, segments: list[Segment], rank: int,
                 algo: str, seed: str | None) -> list[WorkerSide]:
    """A worker's halves, one per segment; a rank other than 0 saves nothing of a segment
    whose KV is the same on every rank (MLA's latent), since rank 0 stores it."""
    make_link = link_factory(cfg, algo, seed)
    return [
        WorkerSide(seg.layout, functools.partial(make_link, seg), cfg.timeout_s,
                   groups=seg.layer_groups(), save=rank == 0 or not seg.layout.shared_ranks)
        for seg in segments
    ]


def tp_rank() -> int:
    """This worker's tensor-parallel rank (0 when vLLM's parallel state is not set up)."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    try:
        return int(get_tensor_model_parallel_rank())
    except (AssertionError, RuntimeError):  # parallel state not initialized: one rank
        return 0
