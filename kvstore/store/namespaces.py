"""The store's book of namespaces: the registry, and the file that keeps it across restarts.

The namespaces file (``config.namespaces_path``) is rewritten atomically on every new
registration and read back at start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvstore.namespace import Namespace, NamespaceRegistry


class NamespaceBook:
    """Registered namespaces. Reads take no lock (one dict read; a registration is one dict
    write), so an event loop may call them; :meth:`register` runs under the store lock."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._registry = NamespaceRegistry()

    def load(self) -> list[Namespace]:
        """Read the namespaces file, if any; returns what it registered."""
        if not self._path or not os.path.exists(self._path):
            return []
        with open(self._path, encoding="utf-8") as fh:
            loaded = [Namespace.from_dict(doc) for doc in json.load(fh)]
        for ns in loaded:
            self._registry.register(ns)
        return loaded

    def register(self, ns: Namespace) -> bool:
        """Register ``ns``; True if new (and then saved), False if an identical one exists.
        Raises :class:`~kvstore.errors.NamespaceConflictError` on a differing definition."""
        new = self._registry.register(ns)
        if new:
            self._save()
        return new

    def get(self, name: str) -> Namespace:
        """The registered namespace ``name``; raises ``UnknownNamespaceError``."""
        return self._registry.get(name)

    def layout_id(self, name: str) -> int | None:
        """The layout id of ``name``, or None if it is not registered."""
        return self._registry.get(name).layout_id if name in self._registry else None

    def all(self) -> list[Namespace]:
        return self._registry.all()

    def _save(self) -> None:
        if not self._path:
            return
        Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{self._path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump([ns.to_dict() for ns in self._registry.all()], fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)  # atomic: a crash leaves the old or the new file, never half
