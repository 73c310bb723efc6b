"""The store's namespaces: registration, and the file that keeps them across restarts.

A mixin of :class:`kvstore.store.Store` over the state of :class:`kvstore.store_core.StoreCore`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvstore.namespace import Namespace
from kvstore.stats import Counters, NamespaceUsage
from kvstore.store_core import StoreCore


class Namespaces(StoreCore):
    """``register_namespace`` and ``namespaces``; the namespaces file (``config.namespaces_path``)
    is rewritten atomically on every new registration and read back at start."""

    def register_namespace(self, ns: Namespace) -> bool:
        """Register ``ns``; True if new, False if an identical one exists. Raises
        :class:`~kvstore.errors.NamespaceConflictError` on a differing definition."""
        with self._lock:
            new = self._namespaces.register(ns)
            if new:
                self._ns_stats.setdefault(ns.name, Counters())
                self._ns_usage.setdefault(ns.name, NamespaceUsage())
                self._save_namespaces()
            return new

    def namespaces(self) -> list[Namespace]:
        return self._namespaces.all()  # one C-level copy of a dict: no lock (see namespace())


    # -- persistence -------------------------------------------------------------------------
    def _load_namespaces(self) -> None:
        path = self.config.namespaces_path
        if not path or not os.path.exists(path):
            return
        with open(path, encoding="utf-8") as fh:
            for doc in json.load(fh):
                ns = Namespace.from_dict(doc)
                self._namespaces.register(ns)
                self._ns_stats.setdefault(ns.name, Counters())
                self._ns_usage.setdefault(ns.name, NamespaceUsage())

    def _save_namespaces(self) -> None:
        path = self.config.namespaces_path
        if not path:
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump([ns.to_dict() for ns in self._namespaces.all()], fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # atomic: a crash leaves the old or the new file, never half
