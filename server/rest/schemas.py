"""REST request and response bodies of the store's own routes (namespaces, blocks, lookup,
stats, health, info, errors). These models are the OpenAPI document: clients and operators'
scripts depend on every field name here; ``/v1/explain``'s bodies are in
:mod:`server.rest.explain_schemas`, the answers the command line reads too in
:mod:`kvstore.protocol.rest`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvstore.namespace import (
    MAX_BLOCK_BYTES,
    MAX_LAYOUT_INT,
    MAX_LAYOUT_STR,
    MAX_SEED_CHARS,
    MAX_TENANT_CHARS,
    Layout,
    Namespace,
)
from kvstore.protocol.explain import ExplainOut
from kvstore.protocol.rest import (
    LookupOut,
    NamespaceDeleted,
    NamespaceList,
    NamespaceOut,
    NamespaceShown,
)
from kvstore.types import BlockHash
from server.rest.explain_schemas import MAX_EXPLAIN_TOKENS, MAX_MM_INPUTS, ExplainIn
from server.rest.fields import (
    HEX_PATTERN,
    MAX_BATCH,
    NAME_PATTERN,
    REF_PATTERN,
    Count,
    HexHash,
    Int,
    NamespaceName,
    NamespaceRef,
)

# re-exported: routes and tests import these from here
__all__ = ["HEX_PATTERN", "MAX_BATCH", "MAX_EXPLAIN_TOKENS", "MAX_MM_INPUTS", "NAME_PATTERN",
           "REF_PATTERN", "ExplainIn", "ExplainOut", "HexHash", "LookupOut", "NamespaceDeleted",
           "NamespaceList", "NamespaceOut", "NamespaceShown"]


class LayoutModel(BaseModel):
    """How the engine lays out one block (identity only; opaque to the store)."""

    model_config = ConfigDict(extra="forbid")

    model_id: str = Field("", max_length=MAX_LAYOUT_STR["model_id"])
    num_layers: Int = Field(0, ge=0, le=MAX_LAYOUT_INT)
    num_kv_heads: Int = Field(0, ge=0, le=MAX_LAYOUT_INT)
    head_dim: Int = Field(0, ge=0, le=MAX_LAYOUT_INT)
    block_size: Int = Field(0, ge=0, le=MAX_LAYOUT_INT)
    dtype: str = Field("", max_length=MAX_LAYOUT_STR["dtype"])
    layout_name: str = Field("", max_length=MAX_LAYOUT_STR["layout_name"])
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="JSON map, at most 8 levels deep and 4 KiB as JSON (checked on register)")

    def to_layout(self) -> Layout:
        return Layout(**self.model_dump())


class NamespaceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: NamespaceName
    block_bytes: Int = Field(gt=0, le=MAX_BLOCK_BYTES, description="size of every block, bytes")
    layout: LayoutModel = Field(default_factory=lambda: LayoutModel.model_validate({}))
    hash_algo: Literal["sha256", "sha256_cbor", "xxhash_cbor"] = "sha256"
    hash_seed: str | None = Field(None, max_length=MAX_SEED_CHARS)
    tenant: str | None = Field(None, min_length=1, max_length=MAX_TENANT_CHARS,
                               description="admin only: bind the namespace to this tenant")

    def to_namespace(self, tenant: str | None) -> Namespace:
        return Namespace(
            name=self.name, block_bytes=self.block_bytes, layout=self.layout.to_layout(),
            hash_algo=self.hash_algo, hash_seed=self.hash_seed, tenant=tenant,
        )


class HashesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: NamespaceRef
    block_hashes: list[HexHash] = Field(max_length=MAX_BATCH)

    def raw_hashes(self) -> list[BlockHash]:
        return [BlockHash(bytes.fromhex(h)) for h in self.block_hashes]


class PrefetchOut(BaseModel):
    accepted: Count = Field(description="hashes queued for onboarding toward the top tier")


class PutOut(BaseModel):
    stored: Count
    existing: Count
    refused: Count


class DeleteOut(BaseModel):
    deleted: Count


class HealthStatusOut(BaseModel):
    """``/healthz`` without a token: whether the server can serve, nothing about its data."""

    ok: bool
    closing: bool | None = Field(None, description="true while shutting down; else absent")


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer carries this body."""

    error: str = Field(description="machine-readable code, e.g. unknown_namespace")
    message: str = Field(description="what was wrong, for humans")
    detail: list[dict[str, Any]] | None = Field(None, description="validation errors (422)")
