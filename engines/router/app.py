"""The router's HTTP face: the OpenAI-compatible ``/v1`` routes (:mod:`engines.router.api`),
``GET /stats``, ``GET /health`` and ``GET /metrics`` (:mod:`engines.router.metrics`).
Translation only; routing is :class:`engines.router.core.Router`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from engines.access import Access
from engines.messages import RouterStats
from engines.router.api import errors
from engines.router.api.errors import APIError
from engines.router.api.limits import BodyCap, Limits
from engines.router.api.routes import make_routes
from engines.router.api.tokenizer import Tokenizer
from engines.router.core import NoWorker, Router
from engines.router.metrics import RouterMetrics


def create_app(router: Router, tokenizer_dir: str | Path | None = None,
               served_model_name: str | None = None, limits: Limits | None = None,
               token: str | None = None) -> FastAPI:
    """The router's ASGI app. ``tokenizer_dir`` (a Hugging Face tokenizer folder) enables
    text prompts and chat; ``served_model_name`` is the model name clients use (default: the
    workers' model folder name); ``limits`` caps what one request may ask (default: the
    production caps of :mod:`engines.router.api.limits`); ``token``
    (:mod:`engines.access`) guards every route but ``/health`` (an OpenAI client sends it
    as its API key). Raises ``ValueError`` for a
    folder without a tokenizer that loads."""
    tokenizer = Tokenizer(tokenizer_dir) if tokenizer_dir else None
    limits = limits or Limits()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await router.start()
        yield
        await router.close()

    app = FastAPI(title="kvstore router", lifespan=lifespan)
    errors.install(app)
    app.add_middleware(BodyCap, max_bytes=limits.max_body_bytes)
    # added after the body cap, so outside it: no body byte is read before the token is checked
    Access(token).install(app, lambda message: APIError(
        401, message, code="invalid_api_key").response())
    app.include_router(RouterMetrics(router).routes())
    app.include_router(make_routes(router, tokenizer, served_model_name, limits))

    @app.get("/stats")
    async def stats() -> RouterStats:
        return router.stats()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """The router is alive; ``ready`` says whether a request could be served now: a worker
        is up, and a prefill worker too when the router has prefill workers (a request needs
        both then)."""
        try:
            router.check_ready()
            if router.prefill:
                router.check_ready(router.prefill)
            ready = True
        except NoWorker:
            ready = False
        return {"ok": True, "ready": ready, "workers_up": sum(w.up for w in router.workers)}

    return app
