"""OpenAI's response and stream-chunk documents (:mod:`engines.router.api.documents`) for
text completions and chat completions.

Both formats answer a whole request (:meth:`response`) or one delta of a stream
(:meth:`chunk`), and end a stream with usage when the client asked for it
(:meth:`usage_chunk`). Completion choices also carry ``token_ids`` (as vLLM can), and whole
responses a ``kvstore`` list: per choice, the worker that served it, its cached prompt tokens
and its time to first token; in a stream, the chunk of a choice's first token carries them
(and where that time went, as the worker measured it) as a ``kvstore`` object.
"""

from __future__ import annotations

import time
import uuid

from engines.router.api.choices import Choice, Delta
from engines.router.api.documents import (
    ChatChoice,
    ChatChunkChoice,
    ChatDelta,
    Chunk,
    CompletionChoice,
    FirstServed,
    Message,
    Response,
    Served,
    Usage,
)


class Format:
    """The documents of one request; ``kind`` is ``text_completion`` or ``chat.completion``."""

    kind = ""
    id_prefix = ""
    chunk_kind = ""

    def __init__(self, model: str, include_usage: bool = False) -> None:
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def response(self, choices: list[Choice], usage: Usage) -> Response:
        return Response(id=self.id, object=self.kind, created=self.created, model=self.model,
                        choices=[self.choice(c) for c in sorted(choices, key=lambda c: c.index)],
                        usage=usage,
                        kvstore=[Served(worker=c.worker, cached_tokens=c.cached_tokens,
                                        ttft_s=c.ttft_s) for c in choices])

    def chunk(self, delta: Delta) -> Chunk | None:
        """The stream chunk of ``delta``, or None when it carries nothing to send."""
        doc = self._chunk([self.chunk_choice(delta)])
        if delta.kvstore is not None:  # a choice's first token: its worker and prefix hit
            doc.kvstore = FirstServed(index=delta.index, worker=delta.kvstore.worker,
                                      **dict(delta.kvstore.message))
        if self.include_usage:  # as OpenAI: every chunk has the key, the last one the value
            doc.usage = None
        return doc

    def usage_chunk(self, usage: Usage) -> Chunk:
        doc = self._chunk([])
        doc.usage = usage
        return doc

    def _chunk(self, choices: list[CompletionChoice | ChatChunkChoice]) -> Chunk:
        return Chunk(id=self.id, object=self.chunk_kind, created=self.created,
                     model=self.model, choices=choices)

    def choice(self, c: Choice) -> CompletionChoice | ChatChoice:
        raise NotImplementedError

    def chunk_choice(self, d: Delta) -> CompletionChoice | ChatChunkChoice:
        raise NotImplementedError


class CompletionFormat(Format):
    kind = chunk_kind = "text_completion"
    id_prefix = "cmpl"

    def choice(self, c: Choice) -> CompletionChoice:
        return CompletionChoice(index=c.index, text=c.text, token_ids=c.token_ids,
                                logprobs=None, finish_reason=c.finish_reason)

    def chunk_choice(self, d: Delta) -> CompletionChoice:
        return CompletionChoice(index=d.index, text=d.text, token_ids=d.token_ids,
                                logprobs=None, finish_reason=d.finish_reason)


class ChatFormat(Format):
    kind = "chat.completion"
    chunk_kind = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def __init__(self, model: str, include_usage: bool = False) -> None:
        super().__init__(model, include_usage)
        self.started: set[int] = set()  # choices whose first chunk (with the role) went out

    def choice(self, c: Choice) -> ChatChoice:
        return ChatChoice(index=c.index, message=Message(role="assistant", content=c.text),
                          logprobs=None, finish_reason=c.finish_reason)

    def chunk(self, delta: Delta) -> Chunk | None:
        if not delta.text and delta.finish_reason is None and delta.index in self.started:
            return None  # a token that completed no text yet
        return super().chunk(delta)

    def chunk_choice(self, d: Delta) -> ChatChunkChoice:
        delta = ChatDelta(content=d.text) if d.text else ChatDelta()
        if d.index not in self.started:
            self.started.add(d.index)
            delta = ChatDelta(role="assistant", content=d.text)
        return ChatChunkChoice(index=d.index, delta=delta, logprobs=None,
                               finish_reason=d.finish_reason)
