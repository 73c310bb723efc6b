"""What one request may ask of the router, and the body cap that enforces the first of them.

Any client can send the router a body, a prompt or a fan-out of choices; each is bounded so
that one request cannot take the router's memory or its event loop from every other:

- the body's bytes (:class:`BodyCap`, 413): checked against ``Content-Length`` before any of
  the body is read, and counted as it arrives when the length is not declared;
- each prompt's tokens (400): the model's context length unless set lower (the workers'
  ``max_model_len``), after tokenization, which runs in a thread so a large text prompt does
  not stall the event loop;
- choices per request, prompts times ``n`` (400);
- the request's time (504 or, once a stream has started, an error event): the request's
  choices are cancelled, and each worker aborts a generation whose caller hung up.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engines.router.api.errors import APIError

# production defaults: a 128k-token prompt is ~1 MB as token ids or text; a batch of them
# fits several times over
DEFAULT_MAX_BODY_BYTES = 8 << 20  # bytes of a request body
DEFAULT_MAX_CHOICES = 256  # prompts x n of one request
DEFAULT_REQUEST_TIMEOUT_S = 600.0  # seconds from a request's arrival to its last token


@dataclass(frozen=True, slots=True)
class Limits:
    """The router's per-request caps; ``max_prompt_tokens`` None is the model's context."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_tokens: int | None = None
    max_choices: int = DEFAULT_MAX_CHOICES
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens <= 0:
            raise ValueError(f"max_prompt_tokens must be positive, got "
                             f"{self.max_prompt_tokens}")
        if self.max_choices <= 0:
            raise ValueError(f"max_choices must be positive, got {self.max_choices}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be positive, got "
                             f"{self.request_timeout_s}")

    def prompt_tokens(self, max_model_len: int) -> int | None:
        """The cap on one prompt's tokens: the lower of the set one and the model's context
        (0: not known yet); None when neither is known."""
        caps = [c for c in (self.max_prompt_tokens, max_model_len) if c]
        return min(caps) if caps else None


class BodyCap:
    """ASGI middleware: a request whose body is over ``max_bytes`` gets 413 (in OpenAI's
    shape) and its connection closed, without the router holding more than ``max_bytes``
    of it: a declared ``Content-Length`` over the cap is refused before any byte is read; an
    undeclared length (chunked) is read up to the cap, then refused."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the server holds it to its length
            return
        messages: list[Message] = []
        size = 0
        while True:  # no declared length: buffer it, counting, then replay it to the app
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = APIError(413, f"the request body is over the router's limit of "
                            f"{self.max_bytes} bytes (--max-body-bytes)",
                       headers={"Connection": "close"})
        await err.response()(scope, receive, send)
