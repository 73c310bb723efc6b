"""REST answers about namespaces and lookups, defined once: the server's routes answer with
them (they are part of its OpenAPI document) and ``kvstore lookup`` / ``kvstore namespaces``
read them, so that a field is named in one place and a reply that is not one fails to parse.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from kvstore.namespace import Namespace
from kvstore.protocol.stats import Count, Counts


class NamespaceOut(BaseModel):
    name: str
    block_bytes: int
    layout: dict[str, Any]
    hash_algo: str
    hash_seed: str | None
    tenant: str | None

    @classmethod
    def of(cls, ns: Namespace) -> NamespaceOut:
        return cls(**ns.to_dict())

    def namespace(self) -> Namespace:
        """The namespace this describes (``ValueError`` for a layout that is not one)."""
        return Namespace.from_dict(self.model_dump(exclude={"stats"}))


class NamespaceList(BaseModel):
    namespaces: list[NamespaceOut]


class NamespaceShown(NamespaceOut):
    stats: Counts = Field(description="the namespace's row of /v1/stats")


class NamespaceDeleted(BaseModel):
    name: str
    blocks: Count = Field(description="blocks the namespace held, now removed from every tier")


class LookupOut(BaseModel):
    prefix_blocks: Count = Field(description="length of the longest cached prefix, in blocks")
    tiers: list[str] = Field(description="top tier holding each block of that prefix")
