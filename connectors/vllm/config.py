"""The connector's settings, read from vLLM's ``kv_connector_extra_config``.

The only place the connector reads the environment: ``KVSTORE_URL`` and ``KVSTORE_TOKEN``
stand in for the ``kvstore_url`` and ``token`` keys when those are absent, so one server can be
named for every engine of a host without editing each engine's config.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from kvstore.problems import problems

TIMEOUT_S = 5.0  # seconds per store call
LEASE_S = 60.0  # seconds a load's pins outlive a crashed engine
RETRY_AFTER_S = 1.0  # seconds of silence after the store was unreachable



def _parse_extra(extra: Mapping[str, Any]) -> BaseModel:
    """Raises ``ValueError`` naming every bad key (never echoing a value: one may be a token)."""
    try:
        return _extra_model().model_validate(dict(extra))
    except ValidationError as exc:
        bad = [f"unknown key {err.where()!r}" if err.kind == "extra_forbidden" else
               f"{err.where()!r}: {err.msg} (got a {type(err.given).__name__})"
               for err in problems(exc)]
        raise ValueError(f"bad kv_connector_extra_config: {'; '.join(bad)}; known keys: "
                         f"{sorted(_extra_model().model_fields)}") from None


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
    requests running beside it, at the cost of a scheduler step or two per hit);
    ``window_stride`` (hybrid models) spaces the sliding windows stored: a window is kept
    before every boundary this many windows apart and before each prompt's end, so a hit in
    between is cut back to the last kept one (0 keeps every block).
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
    window_stride: int = 2

    def __post_init__(self) -> None:
        if self.on_load_error not in ("recompute", "fail"):
            raise ValueError(f"on_load_error must be recompute or fail, got {self.on_load_error!r}")
        if self.load_mode not in ("sync", "async"):
            raise ValueError(f"load_mode must be sync or async, got {self.load_mode!r}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"kvstore_url must be an http(s) URL, got {self.url!r}")
        if not isinstance(self.window_stride, int) or isinstance(self.window_stride, bool) \
                or self.window_stride < 0:
            raise ValueError(f"window_stride must be a whole number >= 0, got "
                             f"{self.window_stride!r}")
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
        parsed = _parse_extra(extra).model_dump()
        url = parsed.pop("kvstore_url") or env.get("KVSTORE_URL")
        if not url:
            raise ValueError(
                "KVStoreConnector needs the kvstore server: set kv_connector_extra_config"
                "['kvstore_url'] (e.g. 'http://127.0.0.1:8000') or KVSTORE_URL"
            )
        # a secret mounted as a variable often ends with a newline, which no header carries
        token = (parsed["token"] or env.get("KVSTORE_TOKEN") or "").strip()
        parsed.update(token=token or None,
                      namespace=parsed["namespace"] or None)
        return cls(url=url.rstrip("/"), **parsed)


@functools.cache
def _extra_model() -> type[BaseModel]:
    """``kv_connector_extra_config`` as typed keys, made from :class:`ConnectorConfig`'s fields
    (``url`` is ``kvstore_url`` there and optional): strict (``"false"`` is not a boolean, a
    number is not a string) and closed (an unknown key is an error, not ignored)."""
    hints = typing.get_type_hints(ConnectorConfig)
    keys: dict[str, Any] = {"kvstore_url": (str | None, None)}
    keys.update((f.name, (hints[f.name], f.default)) for f in dataclasses.fields(ConnectorConfig)
                if f.name != "url")
    return create_model("ExtraConfig", __config__=ConfigDict(extra="forbid", strict=True),
                        **keys)
