"""OpenAI's error shape for the router's ``/v1`` routes.

Every error there, FastAPI's own validation errors included (422 becomes 400, as OpenAI
answers), is ``{"error": {"message", "type", "param", "code"}}``, so that an OpenAI client
raises the matching exception (``BadRequestError`` for 400, ``NotFoundError`` for 404) with
the message. Other routes (``/stats``, ``/health``) keep FastAPI's ``{"detail": ...}``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from kvstore.problems import Problem, problems

PREFIX = "/v1/"


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII characters escaped: an error may quote the request's text, and
    text with a lone surrogate has no UTF-8 form (Starlette's own rendering would fail)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


class APIError(Exception):
    """An answer in OpenAI's error shape; raised anywhere under a ``/v1`` route."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    @property
    def type(self) -> str:
        return "server_error" if self.status >= 500 else "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return AsciiJSONResponse(self.body(), self.status, headers=self.headers)


def unsupported(param: str, why: str) -> APIError:
    """A 400 for a parameter the router refuses rather than ignores."""
    return APIError(400, f"{param} is not supported: {why}", param=param,
                    code="unsupported_parameter")


def from_validation(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 as OpenAI's 400, naming the first offending field."""
    found = problems(exc)
    # a value refused by a check (bad Unicode) says more than a union's other branches'
    # type errors, which pydantic lists first
    first = next((p for p in found if p.kind == "value_error"),
                 found[0] if found else Problem((), "", "invalid request", None))
    # without the body and pydantic's union branch tags ("list[int]", "function-after[...]")
    loc = [str(x) for x in first.loc if x != "body" and "[" not in str(x)]
    if first.kind == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.msg}")
    param = loc[0] if loc else None
    if first.kind == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {'.'.join(loc)}",
                        param=param, code="unsupported_parameter")
    where = ".".join(loc) or "request body"
    more = f" (and {len(found) - 1} more errors)" if len(found) > 1 else ""
    return APIError(400, f"{where}: {first.msg}{more}", param=param)


def from_http(exc: HTTPException) -> APIError:
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    return APIError(400 if exc.status_code == 422 else exc.status_code, detail,
                    headers=dict(exc.headers) if exc.headers else None)


def install(app: FastAPI) -> None:
    """Answer errors under ``/v1/`` in OpenAI's shape; leave the other routes' as they are."""

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return exc.response()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.url.path.startswith(PREFIX):
            return from_http(exc).response()
        return await http_exception_handler(request, exc)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        if request.url.path.startswith(PREFIX):
            return from_validation(exc).response()
        return await request_validation_exception_handler(request, exc)

    async def internal_error(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith(PREFIX):
            return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()
        return PlainTextResponse("Internal Server Error", 500)  # Starlette's own answer

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)  # still logged by the server
