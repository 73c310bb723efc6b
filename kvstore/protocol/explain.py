"""The ``/v1/explain`` answer: a prompt explained block by block against one namespace (each
block's status: stored, evicted, another recipe, never seen), and what changing the recipe
would find. The server answers with it (:mod:`server.rest.explain`) and ``kvstore explain``
reads it (:mod:`kvstore.cli_explain`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from kvstore.explain import Explanation
from kvstore.protocol.stats import Count

Why = Literal["evicted", "deleted", "corrupt", "lost"]
BlockStatus = Literal["stored", "evicted", "other_recipe", "never_seen"]
RecipeField = Literal["hash_algo", "hash_seed", "block_size"]
MAX_EXPLAIN_ROWS = 1024  # block rows of one answer: the rest are pages (offset)


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
    blocks: list[ExplainedBlock] = Field(description="the blocks from offset, at most limit")
    next_offset: Count | None = Field(description="the offset of the next page of blocks; "
                                      "null: none left")

    @classmethod
    def of(cls, ex: Explanation, offset: int = 0, limit: int = MAX_EXPLAIN_ROWS) -> ExplainOut:
        """The answer for ``ex``, with block rows ``offset`` to ``offset + limit``."""
        page = ex.blocks[offset:offset + limit]
        after = offset + len(page)
        return cls.model_validate({
            **{k: getattr(ex, k) for k in ("namespace", "tokens", "tail_tokens",
                                           "prefix_blocks", "prefix_tokens", "first_miss",
                                           "counts", "hints")},
            "recipe": ex.recipe._asdict(),
            "elsewhere": [{**e._asdict(), "recipe": e.recipe._asdict()} for e in ex.elsewhere],
            "blocks": [{"index": b.index, "start": b.start, "end": b.end, "hash": b.hash.hex(),
                        "status": b.status, "tiers": b.tiers,
                        "ghost": b.ghost._asdict() if b.ghost else None,
                        "other": [o._asdict() for o in b.other]} for b in page],
            "next_offset": after if after < len(ex.blocks) else None,
        })
