"""One choice of an OpenAI request: the router's token stream for one prompt, turned into
text with stop strings applied, and the usage of a request's choices.

Every choice streams from its worker, whether or not the client streams: a stop string ends
it at the token that completes it, and the router hangs up, which aborts the worker's
generation. The text of a stop string, and of anything after it, is never returned; text
that could be the start of a stop string is held back until the next token settles it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from engines.router.api.tokenizer import IncrementalDecoder
from engines.router.core import Router

# what a stream's first chunk of a choice passes on from its worker's first event
FIRST_TOKEN_KEYS = ("worker", "prompt_tokens", "cached_tokens", "local_hit_tokens",
                    "store_hit_tokens", "ttft_s", "queue_s", "load_s", "prefill_s")


@dataclass(frozen=True, slots=True)
class Delta:
    """What one step of a choice adds: text, the token (none in the last delta of a stream
    that ran to its end) and, in its last delta, why it finished. The first token's delta
    also carries what its worker said of the prompt (``kvstore``: the worker, the prefix hit
    and where the time to the first token went)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    kvstore: dict[str, Any] | None = None


@dataclass(slots=True)
class Choice:
    """One generation; ``index`` is OpenAI's (prompt ``i``, choice ``j`` of ``n``: ``i*n+j``).
    ``decoder`` is None without a tokenizer (token ids only, no text)."""

    index: int
    prompt_index: int
    prompt_ids: list[int]
    body: dict[str, Any]  # the worker's /generate body
    decoder: IncrementalDecoder | None
    stops: tuple[str, ...] = ()
    token_ids: list[int] = field(default_factory=list)
    text: str = ""  # all text so far: sent, then held back
    sent: int = 0  # characters of ``text`` already returned
    finish_reason: str | None = None
    cached_tokens: int = 0
    worker: str = ""
    ttft_s: float | None = None

    def push(self, token: int) -> Delta:
        """Take the next token; the delta says ``finish_reason="stop"`` when it completed a
        stop string."""
        self.token_ids.append(token)
        if self.decoder is None:
            return Delta(self.index, "", [token], None)
        searched = len(self.text)
        self.text += self.decoder.push(token)
        if self.stops:
            longest = max(map(len, self.stops))
            start = max(0, searched - longest + 1)  # a new match ends in the new text
            hits = [i for s in self.stops if (i := self.text.find(s, start)) >= 0]
            if hits:
                self.text = self.text[:max(min(hits), self.sent)]
                return self.finish("stop", [token])
        return Delta(self.index, self._release(len(self.text) - self._held()), [token], None)

    def finish(self, reason: str, token_ids: list[int] | None = None) -> Delta:
        """The last delta: whatever text was held back, and ``reason``."""
        self.finish_reason = reason
        return Delta(self.index, self._release(len(self.text)), token_ids or [], reason)

    def _held(self) -> int:
        """Characters at the end of ``text`` that may begin a stop string."""
        held = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), held, -1):
                if self.text.endswith(s[:k]):
                    held = k
                    break
        return held

    def _release(self, end: int) -> str:
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out


async def run(router: Router, choice: Choice) -> AsyncIterator[Delta]:
    """Generate ``choice`` through ``router``; yields its deltas, the last with its
    ``finish_reason``. Raises what :meth:`Router.stream` raises."""
    async with contextlib.aclosing(router.stream(choice.body)) as events:
        async for ev in events:
            if "token_id" not in ev:  # the summary: the worker ran to its end
                yield choice.finish(ev["finish_reason"])
                return
            delta = choice.push(ev["token_id"])
            if "worker" in ev:  # the first token: the prompt's prefix hit
                choice.worker, choice.ttft_s = ev["worker"], ev.get("ttft_s")
                choice.cached_tokens = int(ev.get("cached_tokens", 0))
                delta = dataclasses.replace(delta, kvstore={
                    k: v for k, v in ev.items() if k in FIRST_TOKEN_KEYS})
            yield delta
            if delta.finish_reason is not None:
                return  # a stop string: closing the stream aborts the worker's generation


def usage(choices: list[Choice]) -> dict[str, Any]:
    """OpenAI's usage: each prompt counted once however many choices it has; its cached
    tokens are those none of its choices computed (the fewest any choice reused)."""
    prompts: dict[int, Choice] = {}
    cached: dict[int, int] = {}
    for c in choices:
        prompts.setdefault(c.prompt_index, c)
        cached[c.prompt_index] = min(cached.get(c.prompt_index, c.cached_tokens),
                                     c.cached_tokens)
    prompt_tokens = sum(len(c.prompt_ids) for c in prompts.values())
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(cached.values())}}
