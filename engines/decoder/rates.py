"""How fast this engine is, measured as it serves: prefill and decode tokens per second of step
time, and prompt tokens per second loaded from kvstore. Routers read them (worker ``/info``
and ``/kv/events``) to price a request on each worker in seconds.

Each rate is a ratio of exponentially decayed sums (tokens over seconds), so recent steps
count most and a step with many tokens counts more than one with few. A step that both
prefills and decodes is split by the decode rate measured so far: its decode tokens are
charged at that rate and the rest of its time goes to its prefill tokens. A rate is ``None``
until something measured it.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.95  # weight of the past at each new sample


@dataclass(slots=True)
class _Rate:
    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: float, seconds: float) -> None:
        self.tokens = self.tokens * DECAY + tokens
        self.seconds = self.seconds * DECAY + seconds

    @property
    def per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 and self.tokens > 0 else None


class Rates:
    """Measured speeds of one engine; updated by its own thread, read between steps."""

    def __init__(self) -> None:
        self.prefill, self.decode, self.load = _Rate(), _Rate(), _Rate()

    def on_step(self, prefill_tokens: int, decode_tokens: int, seconds: float) -> None:
        """A forward step computed ``prefill_tokens`` prompt tokens and ``decode_tokens``
        output tokens in ``seconds`` (model and sampling, not loads or saves)."""
        if seconds <= 0:
            return
        if not prefill_tokens:
            self.decode.add(decode_tokens, seconds)
            return
        decode_rate = self.decode.per_s
        decode_s = decode_tokens / decode_rate if decode_rate and decode_tokens else 0.0
        self.prefill.add(prefill_tokens, max(seconds - decode_s, seconds / 2))

    def on_load(self, tokens: int, seconds: float) -> None:
        """``tokens`` prompt tokens came from kvstore (lookup and copy) in ``seconds``."""
        if tokens and seconds > 0:
            self.load.add(tokens, seconds)

    def as_dict(self) -> dict[str, float | None]:
        return {"prefill_tokens_per_s": self.prefill.per_s,
                "decode_tokens_per_s": self.decode.per_s,
                "load_tokens_per_s": self.load.per_s}
