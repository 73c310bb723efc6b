"""The what-if curves for Prometheus: each tier's predicted hit ratio at half, once, twice and
four times its capacity (``kvstore_tier_whatif_hit_ratio{tier,capacity}``, ``capacity`` one of
``0.5x``, ``1x``, ``2x``, ``4x``), the sample rate its tracker follows now and the blocks it
tracks. Read from ``store.whatif`` at each scrape; nothing is emitted with the curves off."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstore.store import StoreAPI
from kvstore.whatif import Curve

SCALES = (0.5, 1.0, 2.0, 4.0)  # times today's capacity: the gauges' ``capacity`` label
Curves = Callable[[], Sequence[Curve]]


def store_curves(store: StoreAPI) -> Curves:
    """Every tier's curve over all its traffic; none with the curves off."""
    def curves() -> list[Curve]:
        try:
            return [store.whatif(tier) for tier in store.tier_names()]
        except LookupError:
            return []
    return curves


class WhatIfCollector(Collector):
    def __init__(self, curves: Curves) -> None:
        self._curves = curves

    def collect(self) -> Iterator[Metric]:
        curves = self._curves()
        if not curves:
            return
        ratio = GaugeMetricFamily(
            "kvstore_tier_whatif_hit_ratio", "hit ratio the tier would have at a multiple of "
            "its capacity, on its traffic since start (or the last reset)",
            labels=["tier", "capacity"])
        rate = GaugeMetricFamily("kvstore_tier_whatif_sample_ratio", "share of block hashes "
                                 "the tier's what-if tracker follows now", labels=["tier"])
        keys = GaugeMetricFamily("kvstore_tier_whatif_tracked_blocks", "blocks the tier's "
                                 "what-if tracker follows now", labels=["tier"])
        for curve in curves:
            today = curve.current.capacity_bytes
            for scale in SCALES:
                ratio.add_metric([curve.tier, f"{scale:g}x"], curve.at(today * scale))
            rate.add_metric([curve.tier], curve.sample_rate)
            keys.add_metric([curve.tier], float(curve.tracked_keys))
        yield from (ratio, rate, keys)
