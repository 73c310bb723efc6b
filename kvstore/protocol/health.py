"""Whether the store can serve, and each tier's health: what ``Store.health()`` returns, what
``/healthz`` (with a token) and the data plane's ``health`` op answer with (a tenant's view of
it), what the Prometheus exporter and both clients read.

A tier adds what helps an operator beside ``ok`` (its block counts, free slots, path, why it
is not ok): those fields are the tier's own, kept as they come (the admin's view only).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TierHealth(BaseModel):
    """One tier's health: ``ok``, and for the admin what the tier reports besides."""

    model_config = ConfigDict(extra="allow")

    ok: bool


class StoreHealth(BaseModel):
    """The store's health: ``ok`` when it can serve (an unreachable S3 tier degrades it without
    stopping it), each tier's by name."""

    ok: bool
    closing: bool | None = Field(default=None,
                                 description="true while shutting down; else absent")
    error: str | None = Field(default=None,
                              description="why the store's health could not be read")
    tiers: dict[str, TierHealth] = Field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        """The JSON document: ``closing`` and ``error`` are left out rather than null (a
        tier's own fields are kept as the tier gave them, nulls too)."""
        doc = self.model_dump(mode="json")
        for key in ("closing", "error"):
            if doc[key] is None:
                del doc[key]
        return doc

    def only_ok(self) -> StoreHealth:
        """Whether the store and each tier are ok, nothing else (a tenant's view: the tiers
        hold every tenant's blocks)."""
        return StoreHealth(ok=self.ok, closing=self.closing,
                           tiers={name: TierHealth(ok=t.ok) for name, t in self.tiers.items()})
