"""Text to token ids and back, for the router's OpenAI API.

Tokenization lives in the router, not in the workers. The router routes on the block hashes
of a prompt's token ids, so it must have a text prompt's ids before it picks a worker; workers
stay engines over token ids (as vLLM's engine core is), and one tokenizer serves every worker
behind a router. Detokenization happens here too, where stop strings are matched, so that a
stream stops in one place and the worker is told by the router hanging up (the worker aborts
a stream whose caller leaves).

The tokenizer is a Hugging Face tokenizer folder (``tokenizer.json`` and
``tokenizer_config.json``; usually the model folder) loaded with ``transformers.AutoTokenizer``;
chat messages are rendered with its ``chat_template``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engines.router.api.errors import APIError

DECODE_CONTEXT = 5  # prompt tokens decoded before the output, so its first word gets its space


class Tokenizer:
    """A Hugging Face tokenizer loaded from a local folder. Raises ``ValueError`` when the
    folder holds none that loads."""

    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoTokenizer  # heavy: only when text is served

        try:
            self.hf: Any = AutoTokenizer.from_pretrained(str(folder))
        except Exception as exc:  # transformers raises anything from OSError to KeyError
            raise ValueError(f"no tokenizer loads from there ({type(exc).__name__}: "
                             f"{exc})") from exc

    @property
    def eos_token_id(self) -> int | None:
        eos = self.hf.eos_token_id
        return eos if isinstance(eos, int) else None

    def encode(self, text: str) -> list[int]:
        """A completion prompt's ids, with the tokenizer's special tokens (BOS) as a bare
        prompt gets them."""
        return list(self.hf.encode(text))

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template applied to ``messages``, ending with the assistant's turn. The
        template writes the special tokens itself, so encoding adds none."""
        if not getattr(self.hf, "chat_template", None):
            raise APIError(400, "the router's tokenizer has no chat_template; use "
                                "/v1/completions, or a tokenizer folder with a chat template",
                           param="messages")
        try:
            text = self.hf.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=False)
        except Exception as exc:  # jinja errors, raise_exception() in the template
            raise APIError(400, f"the chat template refused the messages: {exc}",
                           param="messages") from None
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=True))

    def decoder(self, prompt: Sequence[int]) -> IncrementalDecoder:
        return IncrementalDecoder(self, prompt)


class IncrementalDecoder:
    """Output text as tokens arrive, for streams and stop strings.

    A token's text depends on its neighbours (a leading space, a multi-byte character split
    across tokens), so each new token is decoded together with a few tokens before it and
    only the text that grew is returned; text that ends in an incomplete character waits for
    the next token (the offsets scheme of Hugging Face's TGI and vLLM)."""

    def __init__(self, tok: Tokenizer, prompt: Sequence[int]) -> None:
        self.tok = tok
        self.ids = list(prompt[-DECODE_CONTEXT:])
        self.prefix = 0  # ids[prefix:read] is the context already turned into text
        self.read = len(self.ids)

    def push(self, token: int) -> str:
        """The text that ``token`` adds (possibly empty, until a character completes)."""
        self.ids.append(token)
        before = self.tok.decode(self.ids[self.prefix:self.read])
        after = self.tok.decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]
