"""One process's line to the kvstore server: the client plus the rules for a flaky server.

The engine must never crash or hang because the store is down, restarting or refusing, so every
call here either succeeds or reports "unavailable" quickly:

- an unreachable server (connection refused, reset, timeout) marks the link down for
  ``retry_after_s``; calls during that time return at once without touching the network, so a
  dead store costs one failed connect per interval, not one per request;
- a server that forgot the namespace (restarted without its disk tier) gets it registered again
  and the call is retried once;
- anything else the server refuses is logged and treated as a miss (loads) or a dropped save.

Only what no retry can fix is raised, at registration: an engine whose layout, hash algorithm or
seed differs from the namespace's, or whose token the store refuses, must fail at start, not run
with a zero hit rate.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from connectors.vllm.config import ConnectorConfig
from kvstore.client import Grant
from kvstore.namespace import Layout

if TYPE_CHECKING:
    from kvstore.client import SlabMapping

# Under "vllm." so that records show in vLLM's own log format and level.
logger = logging.getLogger(f"vllm.{__name__}")


class StoreUnavailable(Exception):
    """The store could not serve this call; the caller falls back to recomputation."""


class StoreMisconfigured(RuntimeError):
    """The store refuses this engine for a reason no retry can fix (bad token, forbidden
    tenant, a namespace it cannot hold)."""


class NamespaceMismatch(StoreMisconfigured):
    """The store holds this namespace with another layout, block size, algorithm or seed."""


def _default_client(cfg: ConnectorConfig, owner: str) -> Any:
    from kvstore.client import KVStoreClient

    return KVStoreClient(cfg.url, token=cfg.token, timeout=cfg.timeout_s, owner=owner)


# Server error codes that mean "this engine is misconfigured" (see server/errors.py).
_FATAL_CODES = frozenset({"unauthenticated", "forbidden", "invalid_request", "bad_request"})


def _is_unreachable(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError | TimeoutError | OSError)


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "code", "") or type(exc).__name__)


class StoreLink:
    """The store as one namespace sees it. Thread-safe: calls are serialized on one client,
    so a process that loads and saves concurrently opens one link per thread instead."""

    def __init__(
        self,
        cfg: ConnectorConfig,
        namespace: str,
        block_bytes: int,
        layout: Layout,
        hash_algo: str,
        hash_seed: str | None,
        client_factory: Callable[[ConnectorConfig, str], Any] = _default_client,
    ) -> None:
        self.cfg = cfg
        self.namespace = namespace
        self.block_bytes = block_bytes
        self._layout = layout
        self._algo = hash_algo
        self._seed = hash_seed
        self._factory = client_factory
        # One owner id for every client this link builds: pins and grants taken before a
        # reconnect can still be released after it (else they stay until their lease ends).
        self._owner = uuid.uuid4().hex
        self._client: Any = None
        self._registered = False
        self._down_until = 0.0
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def register(self) -> bool:
        """Register the namespace now. Returns False when the store is unreachable (the link
        registers again on its next successful call). Raises :class:`NamespaceMismatch` when
        the store holds the namespace with a different identity, :class:`StoreMisconfigured`
        when it refuses this engine (token, tenant, unsupported hash algorithm)."""
        with self._lock:
            try:
                self._ensure_registered()
                return True
            except StoreUnavailable:
                return False

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                try:
                    self._client.close()
                except Exception:  # closing a dead connection must not mask shutdown
                    logger.debug("closing kvstore client failed", exc_info=True)
                self._client = None

    @property
    def available(self) -> bool:
        """False while the link waits out ``retry_after_s`` after an unreachable server."""
        return time.monotonic() >= self._down_until

    # -- calls -------------------------------------------------------------------------------

    def lookup_tiers(self, hashes: Sequence[bytes]) -> tuple[int, list[str]]:
        """How many leading ``hashes`` the store holds, and the tier of each of them;
        ``(0, [])`` when it cannot say."""
        if not hashes:
            return 0, []
        try:
            n, tiers = self._call(lambda c: c.lookup(self.namespace, list(hashes)))
            return int(n), list(tiers)
        except StoreUnavailable:
            return 0, []

    def lookup_grant(self, hashes: Sequence[bytes]) -> Grant:
        """:meth:`lookup_tiers`, and each block of the hit that the store's host tier holds
        pinned for ``lease_s`` with its place in the store's shared slab, for a worker on this
        host to copy without asking (see :mod:`kvstore.client.grant`). Release the granted
        hashes with :meth:`release_grant`. An empty grant when the store cannot say."""
        if hashes:
            try:
                grant: Grant = self._call(
                    lambda c: c.lookup_acquire(self.namespace, list(hashes), self.cfg.lease_s))
                return grant
            except StoreUnavailable:
                pass
        return Grant(0, [], [], "")

    def release_grant(self, hashes: Sequence[bytes]) -> None:
        """Drop the pins of a :meth:`lookup_grant`; best effort (leases expire anyway)."""
        if hashes:
            with contextlib.suppress(StoreUnavailable):
                self._call(lambda c: c.release_grant(self.namespace, list(hashes), wait=False))

    @property
    def lease_s(self) -> float:
        """How long this link's pins and grants hold: its ``lease_s``, cut to the server's
        ``max_lease_s`` once the link has reached the server."""
        with self._lock:
            client = self._client
        if client is None:
            return self.cfg.lease_s
        return float(client.lease_s(self.cfg.lease_s))

    def granted_slab(self, instance: str) -> SlabMapping | None:
        """This process's mapping of the slab of store ``instance``, if this link is
        connected to that instance through shared memory; None otherwise (fetch instead)."""
        with self._lock:
            if self._client is None or not self._registered:
                return None
            slab: SlabMapping | None = self._client.mapped_slab(instance)
            return slab

    def prefetch(self, hashes: Sequence[bytes]) -> None:
        """Ask the store to bring ``hashes`` toward its fastest tier; best effort."""
        if hashes:
            with contextlib.suppress(StoreUnavailable):
                self._call(lambda c: c.prefetch(self.namespace, list(hashes), wait=False))

    def pin(self, hashes: Sequence[bytes]) -> None:
        """Keep ``hashes`` from eviction for ``lease_s`` (until released); best effort."""
        if hashes:
            with contextlib.suppress(StoreUnavailable):
                self._call(lambda c: c.pin(self.namespace, list(hashes), self.cfg.lease_s,
                                           wait=False))

    def release(self, hashes: Sequence[bytes]) -> None:
        """Drop pins taken by :meth:`pin`; best effort (leases expire anyway)."""
        if hashes:
            with contextlib.suppress(StoreUnavailable):
                self._call(lambda c: c.release(self.namespace, list(hashes), wait=False))

    def get(self, hashes: Sequence[bytes]) -> list[bytes | None]:
        """Bytes of each block, None for a block the store does not hold (or dropped because
        its checksum failed). Raises :class:`StoreUnavailable` when the store cannot answer."""
        return list(self._call(lambda c: c.get(self.namespace, list(hashes))))

    def get_into(self, hashes: Sequence[bytes], buffers: Sequence[Any]) -> list[bool]:
        """Copy each block into the matching writable buffer (one copy, straight from the
        store's shared memory when local); True where found. Raises
        :class:`StoreUnavailable` when the store cannot answer."""
        return list(self._call(lambda c: c.get_into(self.namespace, list(hashes), buffers)))

    def put(self, hashes: Sequence[bytes], blocks: Sequence[Any]) -> bool:
        """Store ``blocks`` under ``hashes``; False when the store did not take them."""
        try:
            self._call(lambda c: c.put(self.namespace, list(hashes), list(blocks)))
            return True
        except StoreUnavailable:
            return False

    # -- the rules ---------------------------------------------------------------------------

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        with self._lock:
            self._ensure_registered()
            try:
                return fn(self._client)
            except Exception as exc:
                if _code(exc) in ("unknown_namespace", "UnknownNamespaceError"):
                    # The server restarted and lost its registry: register and try once more.
                    self._registered = False
                    self._ensure_registered()
                    try:
                        return fn(self._client)
                    except Exception as again:
                        self._fail(again)
                self._fail(exc)

    def _ensure_registered(self) -> None:
        if self._registered:
            return
        if time.monotonic() < self._down_until:
            raise StoreUnavailable("kvstore unreachable; retrying later")
        try:
            if self._client is None:
                self._client = self._factory(self.cfg, self._owner)
            self._client.register_namespace(
                self.namespace,
                self.block_bytes,
                self._layout,
                hash_algo=self._algo,
                hash_seed=self._seed,
            )
        except Exception as exc:
            if _code(exc) in ("namespace_conflict", "NamespaceConflictError"):
                raise NamespaceMismatch(
                    f"kvstore at {self.cfg.url} holds namespace {self.namespace!r} with a "
                    f"different block layout, size, hash algorithm or seed than this engine "
                    f"({self._algo}, seed={self._seed!r}, {self.block_bytes} bytes/block): "
                    f"{exc}"
                ) from exc
            if _code(exc) in _FATAL_CODES:
                raise StoreMisconfigured(
                    f"kvstore at {self.cfg.url} refuses namespace {self.namespace!r}: {exc}"
                ) from exc
            self._fail(exc)
        self._registered = True

    def _fail(self, exc: BaseException) -> None:
        """Classify ``exc`` and raise :class:`StoreUnavailable`."""
        if _is_unreachable(exc):
            # A restarted server may have forgotten the namespace: register again on return.
            self._registered = False
            self._down_until = time.monotonic() + self.cfg.retry_after_s
            self._drop_client()
            logger.warning(
                "kvstore at %s unreachable (%s); serving without it for %.1fs",
                self.cfg.url, exc, self.cfg.retry_after_s,
            )
        else:
            logger.warning("kvstore refused a call on %s: %s", self.namespace, exc)
        raise StoreUnavailable(str(exc)) from exc

    def _drop_client(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                logger.debug("closing a broken kvstore client failed", exc_info=True)
            self._client = None
