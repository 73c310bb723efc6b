"""The store's book of namespaces: the registry, and the file that keeps it across restarts.

The namespaces file (``config.namespaces_path``) is rewritten atomically on every new
registration and deletion and read back at start. It is private to the server's user (0600,
its folder 0700, whatever the umask): layouts and seeds are tenants' business.

The book has its own lock for its registry and its file, so that a registration (which
rewrites and fsyncs the whole file) never holds the store's lock: gets and puts go on while
the file is written. Reads take no lock (one dict read). The number of namespaces is capped
in total and per tenant (:class:`NamespaceLimits`), which also bounds the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from kvstore.errors import NamespaceLimitError
from kvstore.namespace import Namespace, NamespaceRegistry
from kvstore.store.index import make_keys
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.store")


class NamespaceLimits(NamedTuple):
    """How many namespaces may be registered: in all, and bound to any one tenant."""

    total: int
    per_tenant: int


class NamespaceBook:
    """Registered namespaces and their file, under the book's own lock."""

    def __init__(self, path: str | None, limits: NamespaceLimits) -> None:
        self._path = path
        self._limits = limits
        self._registry = NamespaceRegistry()
        self._lock = threading.Lock()  # the registry's writes and the file

    def load(self) -> list[Namespace]:
        """Read the namespaces file, if any; returns what it registered. An entry that is not
        a valid namespace (written by an older version, or edited by hand) is skipped with a
        warning, and the file as found is kept beside it (``.invalid``) before it is ever
        rewritten: one bad entry never stops the store or hides the others."""
        if not self._path or not os.path.exists(self._path):
            return []
        try:
            with open(self._path, encoding="utf-8") as fh:
                docs = json.load(fh)
            if not isinstance(docs, list):
                raise ValueError("not a list of namespaces")
        except (OSError, ValueError, RecursionError) as exc:
            self._keep_invalid(f"unreadable ({exc})")
            return []
        loaded: list[Namespace] = []
        for i, doc in enumerate(docs):
            try:
                ns = Namespace.from_dict(doc)
                self._registry.register(ns)
            except Exception as exc:  # any shape of bad entry: skip it, keep the rest
                name = doc.get("name") if isinstance(doc, dict) else None
                log.warning("namespaces file %s: skipping entry %d (%r): %s",
                            self._path, i, name, exc)
                continue
            loaded.append(ns)
        if len(loaded) != len(docs):
            self._keep_invalid(f"{len(docs) - len(loaded)} invalid entries skipped")
        return loaded

    def register(self, ns: Namespace) -> bool:
        """Register ``ns``; True if new (and then saved), False if an identical one exists.
        Raises :class:`~kvstore.errors.NamespaceConflictError` on a differing definition and
        :class:`~kvstore.errors.NamespaceLimitError` past the caps."""
        with self._lock:
            if ns.name not in self._registry:
                self._check_limits(ns)
            new = self._registry.register(ns)
            if new:
                self._save()
            return new

    def unlist(self, name: str) -> Namespace:
        """Take ``name`` out of the registry (in memory: every call naming it now fails with
        ``UnknownNamespaceError``); :meth:`save` makes it final, :meth:`relist` undoes it."""
        with self._lock:
            return self._registry.remove(name)

    def relist(self, ns: Namespace) -> None:
        """Put back a namespace :meth:`unlist` took out (its deletion failed)."""
        with self._lock:
            self._registry.register(ns)

    def save(self) -> None:
        """Rewrite the file from the registry."""
        with self._lock:
            self._save()

    def get(self, name: str) -> Namespace:
        """The registered namespace ``name``; raises ``UnknownNamespaceError``."""
        return self._registry.get(name)

    def keys(self, name: str, hashes: Sequence[bytes]) -> tuple[Namespace, list[BlockKey]]:
        """The registered namespace ``name`` and the index keys of ``hashes`` in it, as the
        store's calls on a namespace's blocks start; raises ``UnknownNamespaceError``, then
        ``InvalidHashError``. Takes no lock."""
        return self._registry.get(name), make_keys(name, hashes)

    def layout_id(self, name: str) -> int | None:
        """The layout id of ``name``, or None if it is not registered."""
        return self._registry.get(name).layout_id if name in self._registry else None

    def all(self) -> list[Namespace]:
        return self._registry.all()

    def _check_limits(self, ns: Namespace) -> None:
        have = self._registry.all()
        if len(have) >= self._limits.total:
            raise NamespaceLimitError(
                f"the server holds {len(have)} namespaces, its limit (max_namespaces); "
                "delete one first")
        if ns.tenant is not None:
            mine = sum(1 for n in have if n.tenant == ns.tenant)
            if mine >= self._limits.per_tenant:
                raise NamespaceLimitError(
                    f"tenant {ns.tenant!r} holds {mine} namespaces, its limit "
                    "(max_namespaces_per_tenant); delete one first")

    def _save(self) -> None:
        """Write the registry to the file atomically (caller holds the book's lock)."""
        if not self._path:
            return
        docs = [ns.to_dict() for ns in self._registry.all()]
        folder = Path(self._path).parent
        if not folder.exists():
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(folder, 0o700)
        tmp = f"{self._path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), 0o600)  # a .tmp left by an older version may be 0644
            json.dump(docs, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)  # atomic: a crash leaves the old or the new file, never half

    def _keep_invalid(self, why: str) -> None:
        """Keep the file as found (0600) before a registration rewrites it."""
        assert self._path is not None
        keep = f"{self._path}.invalid"
        log.error("namespaces file %s: %s; its content is kept in %s", self._path, why, keep)
        with contextlib.suppress(OSError):
            data = Path(self._path).read_bytes()
            fd = os.open(keep, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "wb") as fh:
                fh.write(data)
