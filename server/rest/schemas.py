"""REST request and response bodies. These models are the OpenAPI document: clients and
operators' scripts depend on every field name here."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from kvstore.explain import Explanation, Prompt
from kvstore.keys import MMHash
from kvstore.namespace import (
    MAX_BLOCK_BYTES,
    MAX_LAYOUT_INT,
    MAX_LAYOUT_STR,
    MAX_SEED_CHARS,
    MAX_TENANT_CHARS,
    Layout,
    Namespace,
)
from kvstore.types import BlockHash

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$"
HEX_PATTERN = r"^(?:[0-9a-fA-F]{2}){1,64}$"
MAX_BATCH = 65536  # hashes per request; the server may configure less



def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    return value


Int = Annotated[int, BeforeValidator(_no_bool)]  # JSON true is not 1 here
HexHash = Annotated[str, Field(pattern=HEX_PATTERN, description="block hash, 1-64 bytes as hex")]
NamespaceName = Annotated[str, Field(pattern=NAME_PATTERN, description="namespace name")]
Count = Annotated[int, Field(ge=0)]


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


class NamespaceList(BaseModel):
    namespaces: list[NamespaceOut]


class NamespaceDeleted(BaseModel):
    name: str
    blocks: Count = Field(description="blocks the namespace held, now removed from every tier")


class HashesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: NamespaceName
    block_hashes: list[HexHash] = Field(max_length=MAX_BATCH)

    def raw_hashes(self) -> list[BlockHash]:
        return [BlockHash(bytes.fromhex(h)) for h in self.block_hashes]


class LookupOut(BaseModel):
    prefix_blocks: Count = Field(description="length of the longest cached prefix, in blocks")
    tiers: list[str] = Field(description="top tier holding each block of that prefix")


class PrefetchOut(BaseModel):
    accepted: Count = Field(description="hashes queued for onboarding toward the top tier")


class PutOut(BaseModel):
    stored: Count
    existing: Count
    refused: Count


class DeleteOut(BaseModel):
    deleted: Count


class Counters(BaseModel):
    """Counters of the whole store, one tier or one namespace."""

    model_config = ConfigDict(extra="allow")

    queries: Count
    hits: Count
    misses: Count
    hit_rate: float = Field(ge=0, le=1)
    blocks: Count
    bytes: Count = Field(description="in a tier: bytes charged against its capacity (whole "
                         "slots in the host and device tiers; logical_bytes beside it); in the "
                         "totals and a namespace: logical bytes, each block once however many "
                         "tiers hold a copy (the admin's totals add charged_bytes, the sum of "
                         "the tiers' bytes)")
    capacity_bytes: Count
    evictions: Count
    promotions: Count
    demotions: Count
    corrupt_dropped: Count
    prefetched: Count = Field(0, description="blocks onboarded to the top tier by prefetch")
    dropped: Count = Field(0, description="blocks that left the store for good")
    stored: Count = Field(0, description="new blocks that puts stored")
    bytes_in: Count = Field(0, description="payload bytes of the stored blocks")
    bytes_out: Count = Field(0, description="payload bytes of the hits served (in a tier: "
                             "the hits it served)")


class TierCounters(Counters):
    logical_bytes: Count = Field(description="payload bytes of the blocks the tier holds")
    occupancy: float = Field(0.0, ge=0, description="bytes / capacity_bytes")


class StatsOut(BaseModel):
    totals: Counters
    tiers: dict[str, TierCounters]
    namespaces: dict[str, Counters]


class NamespaceShown(NamespaceOut):
    stats: Counters = Field(description="the namespace's row of /v1/stats")


class HealthOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    ok: bool
    tiers: dict[str, dict[str, Any]]


class ShmInfo(BaseModel):
    # None: an anonymous memfd, mapped only through the data plane's ``shm_map`` (Unix socket)
    name: str | None = None
    size: Count
    slot_bytes: Count
    gen_offset: Count | None = None  # the slots' generation words (uint64) start here


class InfoOut(BaseModel):
    """What a client needs to reach the data plane."""

    version: str
    protocol: int
    instance: str = Field(description="changes at every server start")
    host_id: str = Field(description="same value for every process on this host")
    data_port: int | None
    unix_socket: str | None
    shm: ShmInfo | None
    auth_required: bool
    max_frame_bytes: int
    max_header_bytes: int
    max_batch: int
    max_lease_s: float | None = Field(
        None, description="longest lease this server grants: leases asked for longer are cut "
                          "to it")


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer carries this body."""

    error: str = Field(description="machine-readable code, e.g. unknown_namespace")
    message: str = Field(description="what was wrong, for humans")
    detail: list[dict[str, Any]] | None = Field(None, description="validation errors (422)")


# -- /v1/explain ----------------------------------------------------------------------------
MAX_EXPLAIN_TOKENS = 1 << 18  # tokens of one explained prompt
MAX_MM_INPUTS = 1024  # multimodal inputs of one explained prompt
TokenId = Annotated[int, Strict(), Field(ge=0, lt=1 << 32)]  # JSON 1.0 and true are refused
Why = Literal["evicted", "deleted", "corrupt", "lost"]
BlockStatus = Literal["stored", "evicted", "other_recipe", "never_seen"]
RecipeField = Literal["hash_algo", "hash_seed", "block_size"]


class MMHashIn(BaseModel):
    """A multimodal input of the prompt, as vLLM hashes it into the blocks it overlaps."""

    model_config = ConfigDict(extra="forbid")

    identifier: str = Field(min_length=1, max_length=256,
                            description="vLLM's mm_feature.identifier (the content hash)")
    offset: Int = Field(ge=0, le=MAX_EXPLAIN_TOKENS, description="first placeholder token")
    length: Int = Field(gt=0, le=MAX_EXPLAIN_TOKENS, description="placeholder tokens")


class ExplainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: NamespaceName
    tokens: list[TokenId] = Field(max_length=MAX_EXPLAIN_TOKENS,
                                  description="the prompt's token ids, as the engine has them")
    cache_salt: str | None = Field(None, max_length=1024, description="the request's "
                                   "cache_salt (enters the first block's hash)")
    lora_name: str | None = Field(None, max_length=1024, description="the LoRA adapter's name "
                                  "(with lora_path: vLLM hashes both into every block)")
    lora_path: str | None = Field(None, max_length=4096, description="the LoRA adapter's path")
    mm_hashes: list[MMHashIn] = Field(default_factory=list, max_length=MAX_MM_INPUTS,
                                      description="multimodal inputs, sorted by offset")

    def to_prompt(self) -> Prompt:
        return Prompt(self.tokens, self.cache_salt, self.lora_name, self.lora_path,
                      tuple(MMHash(m.identifier, m.offset, m.length) for m in self.mm_hashes))


class RecipeOut(BaseModel):
    hash_algo: str
    hash_seed: str | None = Field(description="PYTHONHASHSEED; null: unset")
    block_size: Count = Field(description="tokens per block")


class GhostOut(BaseModel):
    at: float = Field(description="when the block left the store, Unix time in seconds")
    tier: str = Field(description="the tier it left from (for a delete: its top tier)")
    why: Why


class OtherRecipeOut(BaseModel):
    namespace: str
    differs: list[RecipeField] = Field(description="what differs from this namespace's recipe")


class ExplainedBlock(BaseModel):
    index: Count
    start: Count = Field(description="first token of the block")
    end: Count = Field(description="one past its last token")
    hash: str = Field(description="the block's hash under the namespace's recipe, hex")
    status: BlockStatus
    tiers: list[str] = Field(description="every tier holding the block, top first")
    ghost: GhostOut | None = Field(description="how it left the store (status evicted)")
    other: list[OtherRecipeOut] = Field(description="namespaces with another recipe that "
                                        "hold its tokens (a block not stored here)")


class ElsewhereOut(BaseModel):
    namespace: str
    recipe: RecipeOut
    differs: list[RecipeField]
    blocks: Count = Field(description="blocks missing here whose tokens it holds")


class ExplainOut(BaseModel):
    """A prompt explained block by block against one namespace."""

    namespace: str
    recipe: RecipeOut = Field(description="how the chain was computed: the namespace's")
    tokens: Count
    tail_tokens: Count = Field(description="tokens after the last full block: never stored")
    prefix_blocks: Count = Field(description="leading blocks stored: what an engine can load")
    prefix_tokens: Count
    first_miss: Count | None = Field(description="index of the first block not stored; null: "
                                     "every block is")
    counts: dict[BlockStatus, Count]
    hints: list[str] = Field(description="what the statuses mean and what to change")
    elsewhere: list[ElsewhereOut]
    blocks: list[ExplainedBlock]

    @classmethod
    def of(cls, ex: Explanation) -> ExplainOut:
        return cls.model_validate({
            **{k: getattr(ex, k) for k in ("namespace", "tokens", "tail_tokens",
                                           "prefix_blocks", "prefix_tokens", "first_miss",
                                           "counts", "hints")},
            "recipe": ex.recipe._asdict(),
            "elsewhere": [{**e._asdict(), "recipe": e.recipe._asdict()} for e in ex.elsewhere],
            "blocks": [{"index": b.index, "start": b.start, "end": b.end, "hash": b.hash.hex(),
                        "status": b.status, "tiers": b.tiers,
                        "ghost": b.ghost._asdict() if b.ghost else None,
                        "other": [o._asdict() for o in b.other]} for b in ex.blocks],
        })
