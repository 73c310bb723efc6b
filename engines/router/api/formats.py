"""OpenAI's response and stream-chunk documents for text completions and chat completions.

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
from typing import Any

from engines.router.api.choices import Choice, Delta


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

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def response(self, choices: list[Choice], usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._head(self.kind),
                "choices": [self.choice(c) for c in sorted(choices, key=lambda c: c.index)],
                "usage": usage,
                "kvstore": [{"worker": c.worker, "cached_tokens": c.cached_tokens,
                             "ttft_s": c.ttft_s} for c in choices]}

    def chunk(self, delta: Delta) -> dict[str, Any] | None:
        """The stream chunk of ``delta``, or None when it carries nothing to send."""
        doc = {**self._head(self.chunk_kind), "choices": [self.chunk_choice(delta)]}
        if delta.kvstore is not None:  # a choice's first token: its worker and prefix hit
            doc["kvstore"] = {"index": delta.index, "worker": delta.kvstore.worker,
                              **delta.kvstore.message.model_dump()}
        if self.include_usage:  # as OpenAI: every chunk has the key, the last one the value
            doc["usage"] = None
        return doc

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._head(self.chunk_kind), "choices": [], "usage": usage}

    def choice(self, c: Choice) -> dict[str, Any]:
        raise NotImplementedError

    def chunk_choice(self, d: Delta) -> dict[str, Any]:
        raise NotImplementedError


class CompletionFormat(Format):
    kind = chunk_kind = "text_completion"
    id_prefix = "cmpl"

    def choice(self, c: Choice) -> dict[str, Any]:
        return {"index": c.index, "text": c.text, "token_ids": c.token_ids, "logprobs": None,
                "finish_reason": c.finish_reason}

    def chunk_choice(self, d: Delta) -> dict[str, Any]:
        return {"index": d.index, "text": d.text, "token_ids": d.token_ids, "logprobs": None,
                "finish_reason": d.finish_reason}


class ChatFormat(Format):
    kind = "chat.completion"
    chunk_kind = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def __init__(self, model: str, include_usage: bool = False) -> None:
        super().__init__(model, include_usage)
        self.started: set[int] = set()  # choices whose first chunk (with the role) went out

    def choice(self, c: Choice) -> dict[str, Any]:
        return {"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": None, "finish_reason": c.finish_reason}

    def chunk(self, delta: Delta) -> dict[str, Any] | None:
        if not delta.text and delta.finish_reason is None and delta.index in self.started:
            return None  # a token that completed no text yet
        return super().chunk(delta)

    def chunk_choice(self, d: Delta) -> dict[str, Any]:
        content: dict[str, Any] = {"content": d.text} if d.text else {}
        if d.index not in self.started:
            self.started.add(d.index)
            content = {"role": "assistant", "content": d.text}
        return {"index": d.index, "delta": content, "logprobs": None,
                "finish_reason": d.finish_reason}
