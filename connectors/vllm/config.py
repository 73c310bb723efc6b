"""The connector's settings, read from vLLM's ``kv_connector_extra_config``.

The only place the connector reads the environment: ``KVSTORE_URL`` and ``KVSTORE_TOKEN``
stand in for the ``kvstore_url`` and ``token`` keys when those are absent, so one server can be
named for every engine of a host without editing each engine's config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 5.0  # seconds per store call
LEASE_S = 60.0  # seconds a load's pins outlive a crashed engine
RETRY_AFTER_S = 1.0  # seconds of silence after the store was unreachable

_KNOWN_KEYS = frozenset({
    "kvstore_url", "token", "namespace", "timeout_s", "lease_s", "retry_after_s",
    "on_load_error", "prefetch", "load_mode",
})


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """Where the store is and how the connector talks to it.

    ``url`` is the server's REST base URL (the client finds the data plane from it);
    ``namespace`` overrides the name derived from model and KV layout (two engines that must
    share blocks across different model paths set the same one); ``timeout_s`` bounds every
    call so a hung server costs a miss, never a hang; ``lease_s`` bounds how long blocks
    pinned for a load stay pinned if this engine dies; ``retry_after_s`` is how long the
    connector stops calling a server it found unreachable; ``on_load_error`` is what vLLM does
    with a request whose stored blocks could not be loaded: ``"recompute"`` them (the connector
    sets vLLM's ``kv_load_failure_policy`` accordingly) or ``"fail"`` the request;
    ``prefetch`` asks the store to stage a request's blocks in RAM as soon as the scheduler
    sees it (turn off where the store's lower tiers are slow to scan and hits are rare);
    ``load_mode`` is ``"sync"`` (stored blocks are copied in before the forward pass of the
    step that schedules the request: the lowest time to first token) or ``"async"`` (the
    request waits out of the batch while its blocks load, so a slow store never stalls the
    requests running beside it, at the cost of a scheduler step or two per hit).
    """

    url: str
    token: str | None = None
    namespace: str | None = None
    timeout_s: float = TIMEOUT_S
    lease_s: float = LEASE_S
    retry_after_s: float = RETRY_AFTER_S
    on_load_error: str = "recompute"
    prefetch: bool = True
    load_mode: str = "sync"

    def __post_init__(self) -> None:
        if self.on_load_error not in ("recompute", "fail"):
            raise ValueError(f"on_load_error must be recompute or fail, got {self.on_load_error!r}")
        if self.load_mode not in ("sync", "async"):
            raise ValueError(f"load_mode must be sync or async, got {self.load_mode!r}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"kvstore_url must be an http(s) URL, got {self.url!r}")
        for name in ("timeout_s", "lease_s", "retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")

    @classmethod
    def from_extra(
        cls, extra: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> ConnectorConfig:
        """Build from ``kv_connector_extra_config``; ``env`` defaults to ``os.environ``.

        Raises ``ValueError`` naming the problem for an unknown key (a typo would otherwise be
        ignored silently), a missing URL, or a bad value.
        """
        env = os.environ if env is None else env
        unknown = set(extra) - _KNOWN_KEYS
        if unknown:
            raise ValueError(
                f"unknown kv_connector_extra_config keys {sorted(unknown)}; "
                f"known: {sorted(_KNOWN_KEYS)}"
            )
        url = extra.get("kvstore_url") or env.get("KVSTORE_URL")
        if not url:
            raise ValueError(
                "KVStoreConnector needs the kvstore server: set kv_connector_extra_config"
                "['kvstore_url'] (e.g. 'http://127.0.0.1:8000') or KVSTORE_URL"
            )
        return cls(
            url=str(url).rstrip("/"),
            token=extra.get("token") or env.get("KVSTORE_TOKEN") or None,
            namespace=extra.get("namespace") or None,
            timeout_s=float(extra.get("timeout_s", TIMEOUT_S)),
            lease_s=float(extra.get("lease_s", LEASE_S)),
            retry_after_s=float(extra.get("retry_after_s", RETRY_AFTER_S)),
            on_load_error=str(extra.get("on_load_error", "recompute")),
            prefetch=bool(extra.get("prefetch", True)),
            load_mode=str(extra.get("load_mode", "sync")),
        )
