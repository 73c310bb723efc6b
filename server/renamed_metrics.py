"""Metric names that changed, and the registry that keeps the old ones for one release.

The names follow Prometheus' conventions: the unit last, in base units and plural
(``kvstore_received_bytes_total``, ``kvstore_pinned_blocks``, ``..._ratio`` for a 0-1 value),
``_total`` on counters only, ``_duration_seconds`` on a latency histogram. Each exporter (the
server, an engine worker, the router) builds its :class:`RenamingRegistry` with the renames of
its own series; the registry yields every family it collects and, for a renamed one, a copy
under the old name whose HELP reads ``deprecated: use <new name>``, so that dashboards and
alerts keep working while they move. The old names go in the release after the one that
renamed them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

__all__ = ["RenamingRegistry", "deprecated_copy", "exported_name"]

DEPRECATED = "deprecated: use "  # how an old name's HELP text starts


def exported_name(family: Metric) -> str:
    """The name a scrape shows for ``family`` (a counter's ends in ``_total``)."""
    return f"{family.name}_total" if family.type == "counter" else family.name


def deprecated_copy(family: Metric, old: str) -> Metric:
    """``family``'s samples under the family name ``old`` (``_total``, ``_bucket``, ``_sum``...
    kept), with a HELP text that names the new one."""
    copy = Metric(old, DEPRECATED + exported_name(family), family.type)
    copy.samples = [s._replace(name=old + s.name[len(family.name):]) for s in family.samples]
    return copy


class RenamingRegistry(CollectorRegistry):
    """A registry that also exports each family of ``renamed`` (new family name -> old family
    name, both without a counter's ``_total``) under its old name."""

    def __init__(self, renamed: Mapping[str, str]) -> None:
        super().__init__()
        self.renamed = dict(renamed)

    def collect(self) -> Iterator[Metric]:
        for family in super().collect():
            yield family
            old = self.renamed.get(family.name)
            if old is not None:
                yield deprecated_copy(family, old)
