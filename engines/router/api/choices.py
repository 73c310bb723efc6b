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

from engines.messages import FirstToken, GenerateReply, GenerateRequest, PrefixHit
from engines.router.api.documents import PromptDetails, Usage
from engines.router.api.stops import StopMatcher
from engines.router.api.tokenizer import IncrementalDecoder
from engines.router.core import Routed, Router


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
    kvstore: Routed[PrefixHit] | None = None


@dataclass(slots=True)
class Choice:
    """One generation; ``index`` is OpenAI's (prompt ``i``, choice ``j`` of ``n``: ``i*n+j``).
    ``decoder`` is None without a tokenizer (token ids only, no text); ``stops`` is None
    without stop strings; ``session`` is the key of affinity routing."""

    index: int
    prompt_index: int
    prompt_ids: list[int]
    request: GenerateRequest  # what its worker is asked
    decoder: IncrementalDecoder | None
    stops: StopMatcher | None = None
    session: str | None = None
    token_ids: list[int] = field(default_factory=list)
    # text already returned, in pieces (joining at each token would copy the whole text per
    # token), and the text after it: held back, or about to be returned
    released: list[str] = field(default_factory=list)
    pending: str = ""
    finish_reason: str | None = None
    cached_tokens: int = 0
    worker: str = ""
    ttft_s: float | None = None

    @property
    def text(self) -> str:
        """All text so far, returned and held back."""
        return "".join(self.released) + self.pending

    def push(self, token: int) -> Delta:
        """Take the next token; the delta says ``finish_reason="stop"`` when it completed a
        stop string."""
        self.token_ids.append(token)
        if self.decoder is None:
            return Delta(self.index, "", [token], None)
        new = self.decoder.push(token)
        if self.stops is None:
            self.pending += new
            return Delta(self.index, self._release(len(self.pending)), [token], None)
        at = self.stops.feed(new)  # reads only ``new``: linear in the generated text
        if at is not None:
            # the stop string and all after it are dropped; it never starts in text already
            # returned, because text that may begin one is held back
            self.pending = (self.pending + new)[:max(0, len(self.pending) + at)]
            return self.finish("stop", [token])
        self.pending += new
        keep = self.stops.held
        return Delta(self.index, self._release(len(self.pending) - keep), [token], None)

    def finish(self, reason: str | None, token_ids: list[int] | None = None) -> Delta:
        """The last delta: whatever text was held back, and ``reason``."""
        self.finish_reason = reason
        return Delta(self.index, self._release(len(self.pending)), token_ids or [], reason)

    def _release(self, n: int) -> str:
        """Return the first ``n`` characters of the pending text."""
        out, self.pending = self.pending[:n], self.pending[n:]
        if out:
            self.released.append(out)
        return out


async def run(router: Router, choice: Choice) -> AsyncIterator[Delta]:
    """Generate ``choice`` through ``router``; yields its deltas, the last with its
    ``finish_reason``. Raises what :meth:`Router.stream` raises."""
    async with contextlib.aclosing(router.stream(choice.request, choice.session)) as events:
        async for worker, ev in events:
            if isinstance(ev, GenerateReply):  # the worker ran to its end
                yield choice.finish(ev.finish_reason)
                return
            delta = choice.push(ev.token_id)
            if isinstance(ev, FirstToken):  # the prompt's prefix hit
                choice.worker, choice.ttft_s = worker, ev.ttft_s
                choice.cached_tokens = ev.cached_tokens
                delta = dataclasses.replace(delta, kvstore=Routed(worker, ev.hit()))
            yield delta
            if delta.finish_reason is not None:
                return  # a stop string: closing the stream aborts the worker's generation


def usage(choices: list[Choice]) -> Usage:
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
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=PromptDetails(cached_tokens=sum(cached.values())))
