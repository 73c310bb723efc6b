"""The documents the ``/v1`` routes answer with, as OpenAI defines them: a whole
:class:`Response`, a stream's :class:`Chunk` and the :class:`Usage` in either, with the
router's ``kvstore`` additions (per choice: its worker and prefix hit), and the
:class:`ModelList` of ``/v1/models``.

A chunk leaves out what it does not carry (``kvstore`` but on a choice's first token,
``usage`` unless the client asked for it, a chat delta's ``role`` after the first), so
chunks are written with :meth:`Chunk.text`, which keeps only the fields that were set; every
field of the other documents is always set.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field

from engines.messages import PrefixHit


class PromptDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens no choice computed")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptDetails


class CompletionChoice(BaseModel):
    """A completion choice, whole or as one delta of a stream (its text since the last)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: None
    finish_reason: str | None


class Message(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: Message
    logprobs: None
    finish_reason: str | None


class ChatDelta(BaseModel):
    """What a chat chunk adds: the role in a choice's first chunk, then text when any."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: None
    finish_reason: str | None


class Served(BaseModel):
    """Where a whole response's choice ran: its worker and prefix hit."""

    worker: str
    cached_tokens: int
    ttft_s: float | None


class FirstServed(PrefixHit):
    """Where a streamed choice runs, in the chunk of its first token: its worker, the
    prompt's prefix hit and where the time to that token went."""

    index: int
    worker: str


class Head(BaseModel):
    id: str
    object: str
    created: int = Field(description="unix seconds")
    model: str


class Response(Head):
    choices: list[CompletionChoice | ChatChoice]
    usage: Usage
    kvstore: list[Served]


class Chunk(Head):
    choices: list[CompletionChoice | ChatChunkChoice]
    kvstore: FirstServed | None = None
    usage: Usage | None = None

    def text(self) -> str:
        """The chunk's JSON: the fields that were set (see the module), in ASCII (``json``
        escapes the rest)."""
        return json.dumps(self.model_dump(exclude_unset=True))


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int = Field(description="unix seconds")
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
