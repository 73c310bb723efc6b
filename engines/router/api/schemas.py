"""The requests of ``/v1/completions`` and ``/v1/chat/completions``, as OpenAI defines them.

Fields the router cannot honour are refused, never ignored: an unknown field is a 400
("Unrecognized request argument supplied"), and a known one the engine cannot serve
(``logprobs``, ``echo``, ``suffix``, penalties, ``logit_bias``, tools, a JSON
``response_format``) is a 400 naming it (:meth:`Sampling.refuse_unsupported`). ``stop``
(strings), ``n``, ``seed``, ``stream`` and ``stream_options.include_usage`` are served, and so
are vLLM's ``ignore_eos``, ``stop_token_ids`` and ``cache_salt`` extensions.

Sampling values are checked against what the engine's sampler can use: ``temperature`` in
OpenAI's [0, 2] and ``top_p`` in (0, 1] (vLLM's ranges). A temperature or a top_p below
:data:`SAMPLING_EPS` is sampled greedily, as vLLM does: the limit of temperature sampling as
the temperature goes to 0 is the most likely token, and so is nucleus sampling's as top_p
does, while dividing logits by a temperature that small overflows them (and a top_p that
small rounds to 0 in float32), which no distribution survives. Text (prompts, messages,
stop strings, the salt) must be valid Unicode: a lone surrogate is a 400.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from engines.messages import MAX_SALT_CHARS
from engines.router.api.errors import APIError, unsupported

MAX_N = 16  # choices per prompt
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
SAMPLING_EPS = 1e-5  # temperature or top_p below this: greedy (vLLM's _SAMPLING_EPS)
MAX_TEMPERATURE = 2.0  # OpenAI's range
MAX_STOPS = 16  # stop strings per request (OpenAI allows 4)
MAX_STOP_CHARS = 1024  # characters per stop string
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # int64, as OpenAI's seed; seed + j stays in uint64


def valid_text(text: str) -> str:
    """``text`` if it encodes as UTF-8; a lone surrogate (JSON ``"\\ud800"``) does not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text: a lone surrogate "
                         f"(U+{ord(text[exc.start]):04X}) at character {exc.start}") from None
    return text


Text = Annotated[str, AfterValidator(valid_text)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False


class Sampling(Strict):
    """What both routes share: the model, sampling, stop conditions, choices, streaming."""

    model: Text | None = None  # None: the served model
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE)  # OpenAI's default; 0: greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: Text | None = None  # an end-user or session id: the key of --policy session
    ignore_eos: bool = False  # vLLM's extension
    stop_token_ids: list[int] = []  # vLLM's extension
    # vLLM's extension: prefix-cache hits only between requests with the same salt
    cache_salt: Text | None = Field(None, min_length=1, max_length=MAX_SALT_CHARS)

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise APIError(400, "stop strings must not be empty", param="stop")
        if len(stops) > MAX_STOPS:
            raise APIError(400, f"at most {MAX_STOPS} stop strings, got {len(stops)}",
                           param="stop")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise APIError(400, f"a stop string has at most {MAX_STOP_CHARS} characters, got "
                                f"{max(map(len, stops))}", param="stop")
        return tuple(stops)

    def sampling(self) -> tuple[float, float]:
        """The ``temperature`` and ``top_p`` the worker samples with: greedy (0, 1) when
        either is below :data:`SAMPLING_EPS` (see the module's docstring)."""
        if self.temperature < SAMPLING_EPS or self.top_p < SAMPLING_EPS:
            return 0.0, 1.0
        return self.temperature, self.top_p

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def refuse_unsupported(self) -> None:
        """Raise a 400 :class:`APIError` for the first parameter the engine cannot honour."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true",
                           param="stream_options")
        if self.presence_penalty or self.frequency_penalty:
            param = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            raise unsupported(param, "the engine samples without penalties")
        if self.logit_bias:
            raise unsupported("logit_bias", "the engine samples without logit biases")


class CompletionRequest(Sampling):
    prompt: list[int] | list[list[int]] | Text | list[Text]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs is not None:
            raise unsupported("logprobs", "the engine does not compute log probabilities")
        if self.echo:
            raise unsupported("echo", "the prompt is not returned with the completion")
        if self.best_of not in (None, self.n):
            raise unsupported("best_of", "choices are not ranked (no log probabilities); use n")
        if self.suffix is not None:
            raise unsupported("suffix", "the engine does not insert text")

    def output_budget(self, prompt_len: int, max_model_len: int) -> int:
        return self.max_tokens or COMPLETION_MAX_TOKENS


class ContentPart(BaseModel):
    """A part of a message's content; only ``text`` parts are served (checked when the
    message is rendered, so that an image part gets a message that says so)."""

    model_config = ConfigDict(extra="allow")
    type: Text
    text: Text | None = None


class ChatMessage(Strict):
    role: Text
    content: Text | list[ContentPart]
    name: Text | None = None

    def as_template_input(self) -> dict[str, str]:
        """The message as chat templates expect it: text parts joined by newlines."""
        parts = [self.content] if isinstance(self.content, str) else []
        for p in self.content if not isinstance(self.content, str) else []:
            if p.type != "text" or p.text is None:
                raise unsupported("messages", f"content parts of type {p.type!r}: the model "
                                              "reads text parts only")
            parts.append(p.text)
        out = {"role": self.role, "content": "\n".join(parts)}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs is not None:
            param = "logprobs" if self.logprobs else "top_logprobs"
            raise unsupported(param, "the engine does not compute log probabilities")
        if self.response_format and self.response_format.get("type") != "text":
            raise unsupported("response_format", "only {\"type\": \"text\"}: the engine does "
                                                 "not constrain its output")
        if self.tools:
            raise unsupported("tools", "the router does not parse tool calls")
        if self.tool_choice not in (None, "none"):
            raise unsupported("tool_choice", "the router does not parse tool calls")

    def output_budget(self, prompt_len: int, max_model_len: int) -> int:
        """``max_completion_tokens`` (or the older ``max_tokens``); without either, what is
        left of the model's length, as OpenAI's chat does."""
        given = self.max_completion_tokens or self.max_tokens
        if given:
            return given
        return max(1, max_model_len - prompt_len) if max_model_len else COMPLETION_MAX_TOKENS
