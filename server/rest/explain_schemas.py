"""The ``/v1/explain`` request: a prompt's token ids (and what else its hashes depend on). The
answer, each of its blocks' status, is :class:`kvstore.protocol.explain.ExplainOut`, which the
command line reads too. Part of the OpenAPI document, like :mod:`server.rest.schemas`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from kvstore.explain import Prompt
from kvstore.keys import MMHash
from kvstore.protocol.explain import MAX_EXPLAIN_ROWS
from server.rest.fields import Int, NamespaceRef

MAX_EXPLAIN_TOKENS = 1 << 18  # tokens of one explained prompt
MAX_EXPLAIN_BLOCKS = 1 << 14  # full blocks of one explained prompt (max_batch, if less)
MAX_MM_INPUTS = 1024  # multimodal inputs of one explained prompt
TokenId = Annotated[int, Strict(), Field(ge=0, lt=1 << 32)]  # JSON 1.0 and true are refused


class MMHashIn(BaseModel):
    """A multimodal input of the prompt, as vLLM hashes it into the blocks it overlaps."""

    model_config = ConfigDict(extra="forbid")

    identifier: str = Field(min_length=1, max_length=256,
                            description="vLLM's mm_feature.identifier (the content hash)")
    offset: Int = Field(ge=0, le=MAX_EXPLAIN_TOKENS, description="first placeholder token")
    length: Int = Field(gt=0, le=MAX_EXPLAIN_TOKENS, description="placeholder tokens")


class ExplainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: NamespaceRef
    tokens: list[TokenId] = Field(max_length=MAX_EXPLAIN_TOKENS,
                                  description="the prompt's token ids, as the engine has them")
    cache_salt: str | None = Field(None, max_length=1024, description="the request's "
                                   "cache_salt (enters the first block's hash)")
    lora_name: str | None = Field(None, max_length=1024, description="the LoRA adapter's name "
                                  "(with lora_path: vLLM hashes both into every block)")
    lora_path: str | None = Field(None, max_length=4096, description="the LoRA adapter's path")
    mm_hashes: list[MMHashIn] = Field(default_factory=list, max_length=MAX_MM_INPUTS,
                                      description="multimodal inputs, sorted by offset")
    offset: Int = Field(0, ge=0, le=MAX_EXPLAIN_BLOCKS, description="the first block row "
                        "of the answer (the summary is always the whole prompt's)")
    limit: Int = Field(MAX_EXPLAIN_ROWS, ge=0, le=MAX_EXPLAIN_ROWS, description="block rows "
                       "of the answer at most, from offset; next_offset says where the next "
                       "page starts")

    def to_prompt(self) -> Prompt:
        return Prompt(self.tokens, self.cache_salt, self.lora_name, self.lora_path,
                      tuple(MMHash(m.identifier, m.offset, m.length) for m in self.mm_hashes))
