"""The HTTP worker: one :class:`~engines.decoder.runner.Engine` behind FastAPI.

The engine runs in one thread (:class:`~engines.engine_loop.EngineLoop`); request handlers
hand it work through a queue and receive tokens through per-request asyncio queues, so new
requests join the running batch at the next step. Roles: ``both`` serves ``/generate`` and
``/prefill``; ``prefill`` only ``/prefill`` (compute the prompt's KV, store its full blocks in
kvstore, return their hashes); ``decode`` only ``/generate``, whose prompt blocks come from
kvstore when a prefill worker stored them.

Routes: ``POST /generate`` (JSON or ``stream`` SSE), ``POST /prefill``, ``GET /info`` (block
geometry, hash recipe and measured rates, for routers), ``GET /kv/events?since=N`` (residency
events and the rates again, so a polling router keeps them current), ``GET /stats``,
``GET /metrics`` (Prometheus, :mod:`engines.worker_metrics`), ``GET /health``, and for the SLO
planner ``POST /admin/role`` (switch the role at run time) and ``GET /latency`` (see
:mod:`engines.worker_control`).

A streamed generation's first event carries the prompt's prefix hit (``cached_tokens``, known
once the prompt is scheduled) beside its token, so that a caller that stops reading early (the
router, at a stop string) still knows it; a stream whose caller goes away is aborted, and its
blocks freed, at the engine's next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from engines.access import Access
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.engine_loop import EngineLoop, Pending
from engines.messages import (
    FirstToken,
    GenerateReply,
    GenerateRequest,
    KVEvent,
    KVEvents,
    PrefillReply,
    PrefillRequest,
    PrefixHit,
    StreamError,
    Token,
    WorkerInfo,
    WorkerStats,
)
from engines.worker_control import ROLES, WorkerControl, install
from engines.worker_metrics import WorkerMetrics
from kvstore.problems import problems

__all__ = ["ROLES", "EngineLoop", "Pending", "create_app"]


def sampling(req: GenerateRequest) -> SamplingParams:
    """The engine's parameters of ``req``; ``ValueError`` for values no sampler can use."""
    return SamplingParams(req.max_tokens, req.temperature, req.top_p, req.seed,
                          req.ignore_eos, tuple(req.stop_token_ids))


@dataclass(slots=True)
class Counters:
    """What the worker counts of its requests (for ``/stats``)."""

    requests: int = 0
    prefills: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0


async def bad_request(_: Request, exc: Exception) -> JSONResponse:
    """A body that does not validate is a 400 naming each bad field in one line (FastAPI's
    default is a 422 with a nested list): the caller's error, never the worker's."""
    assert isinstance(exc, RequestValidationError)
    parts = [f"{where}: {err.msg}" if (where := err.where(skip=("body",))) else err.msg
             for err in problems(exc)]
    return JSONResponse({"detail": "; ".join(parts)}, status_code=400)


def sse(event: BaseModel) -> str:
    """One server-sent event carrying ``event``'s JSON."""
    return f"data: {event.model_dump_json()}\n\n"


def _hex(hashes: list[bytes]) -> list[str]:
    return [h.hex() for h in hashes]


def create_app(engine: Engine, role: str = "both", token: str | None = None) -> FastAPI:
    """The worker's ASGI app; starts and stops the engine thread with the app's lifespan.
    ``role`` is the starting role (``POST /admin/role`` switches it, see
    :mod:`engines.worker_control`). ``token`` (see :mod:`engines.access`) guards every route
    but ``/health``; without one the admin route is closed."""
    access = Access(token)
    control = WorkerControl(role, can_prefill=engine.connector is not None, access=access)
    counters = Counters()

    def snapshot() -> WorkerStats:
        with loop.lock:
            return WorkerStats(role=control.role, **dataclasses.asdict(counters),
                               role_switches=control.switches,
                               engine=engine.stats(), inflight=len(loop.pending))

    metrics = WorkerMetrics(snapshot)
    loop = EngineLoop(engine, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop.start()
        yield
        loop.stop()

    app = FastAPI(title="kvstore engine worker", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, bad_request)
    access.install(app)

    def prompt_hashes(prompt: list[int], cache_salt: str | None) -> list[bytes]:
        return list(engine.hasher.hash_blocks(prompt, cache_salt=cache_salt))

    async def collect(p: Pending) -> list[int]:
        out = []
        while (tok := await p.tokens.get()) is not None:
            out.append(tok)
        if p.error:
            raise HTTPException(400 if p.seq is None else 500, p.error)
        return out

    def prefix_hit(p: Pending) -> PrefixHit:
        """The prompt's prefix hit and where its time to the first token went (``queue_s``
        counts the step in flight when it arrived); final once the first token is out."""
        seq = p.seq
        assert seq is not None
        ttft = (seq.first_token_at - seq.arrival) if seq.first_token_at else None
        joined = seq.admitted_at
        return PrefixHit(
            prompt_tokens=seq.num_prompt,
            cached_tokens=seq.local_hit_tokens + seq.store_hit_tokens,
            local_hit_tokens=seq.local_hit_tokens, store_hit_tokens=seq.store_hit_tokens,
            ttft_s=ttft,
            queue_s=None if joined is None else joined - p.submitted_at - seq.load_s,
            load_s=seq.load_s,
            prefill_s=None if joined is None or seq.first_token_at is None
            else seq.first_token_at - joined)

    def summary(p: Pending, started: float, kind: str = "generate") -> GenerateReply:
        seq = p.seq
        assert seq is not None
        hit = prefix_hit(p)
        counters.generated_tokens += len(seq.output)
        counters.cached_tokens += hit.cached_tokens
        control.record(kind, hit.ttft_s, seq.first_token_at, len(seq.output))
        return GenerateReply(**dict(hit), token_ids=seq.output,
                             finish_reason=seq.finish_reason,
                             latency_s=time.perf_counter() - started)

    @app.post("/generate", response_model=None)
    async def generate(req: GenerateRequest) -> GenerateReply | StreamingResponse:
        control.refuse("generate")
        if req.block_hashes is not None:
            # the handoff must name exactly the blocks we would look up, or the hash recipes
            # differ and every lookup would silently miss
            mine = _hex(prompt_hashes(req.prompt_ids, req.cache_salt))
            if req.block_hashes != mine[:len(req.block_hashes)]:
                raise HTTPException(409, "block_hashes do not match this worker's hash recipe")
        try:
            params = sampling(req)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        counters.requests += 1
        started = time.perf_counter()
        p = loop.submit(req.prompt_ids, params, req.cache_salt)
        if not req.stream:
            await collect(p)
            return summary(p, started)
        # wait for the first token before answering, so that a request the engine refuses
        # gets the same 400 as without stream (a router must not take it for a failed worker)
        first = await p.tokens.get()
        if first is None and p.error:
            raise HTTPException(400 if p.seq is None else 500, p.error)

        async def events() -> AsyncIterator[str]:
            tok = first
            try:
                if tok is not None:
                    yield sse(FirstToken(**dict(prefix_hit(p)), token_id=tok))
                    tok = await p.tokens.get()
                while tok is not None:
                    yield sse(Token(token_id=tok))
                    tok = await p.tokens.get()
            finally:
                if tok is not None:  # the caller went away mid-generation
                    loop.cancel(p)
            if p.error:
                yield sse(StreamError(error=p.error))
            else:
                yield sse(summary(p, started))
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/prefill")
    async def prefill(req: PrefillRequest) -> PrefillReply:
        """Compute the prompt's KV and store its full blocks; the reply is the handoff."""
        control.refuse("prefill")
        if engine.connector is None:
            raise HTTPException(409, "prefill needs --kvstore: blocks go to the store")
        counters.prefills += 1
        started = time.perf_counter()
        p = loop.submit(req.prompt_ids, SamplingParams(max_tokens=1, ignore_eos=True),
                        req.cache_salt)
        first = await collect(p)
        hashes = prompt_hashes(req.prompt_ids, req.cache_salt)
        out = summary(p, started, "prefill")
        return PrefillReply(prompt_ids=req.prompt_ids, block_hashes=_hex(hashes),
                            namespace=engine.namespace, first_token=first[0],
                            cached_tokens=out.cached_tokens, latency_s=out.latency_s)

    @app.get("/info")
    async def info() -> WorkerInfo:
        e = engine.ecfg
        connector = engine.connector
        node = await asyncio.to_thread(connector.store.node_id) if connector else None
        stored_as = connector.store.store_name(engine.namespace) if connector else None
        return WorkerInfo(
            role=control.role, model_id=engine.model_cfg.model_id, block_size=e.block_size,
            hash_algo=e.hash_algo, hash_seed=e.hash_seed, namespace=engine.namespace,
            block_bytes=engine.block_bytes, num_blocks=e.num_blocks,
            kvstore=engine.connector is not None, device=str(e.device),
            rates=engine.rates.as_dict(), kvstore_node=node, kvstore_namespace=stored_as,
            max_model_len=min(engine.model_cfg.max_position_embeddings,
                              e.num_blocks * e.block_size))

    # /kv/events and /stats wait for the engine lock, which a forward step holds: plain
    # ``def`` routes (a worker thread), so that the wait never stalls the event loop and with
    # it every stream this worker is sending.
    @app.get("/kv/events")
    def kv_events(since: int = 0) -> KVEvents:
        """Residency events after cursor ``since``. ``resync`` is true (and ``resident``
        lists every resident hash) when events the caller has not seen were dropped."""
        with loop.lock:
            events, cursor = engine.blocks.events_since(since)
            oldest = engine.blocks.events[0].seq if engine.blocks.events else cursor + 1
            # a cursor ahead of ours means this engine restarted or reset its cache
            resync = since > cursor or (since < oldest - 1 and since < cursor)
            resident = _hex(engine.blocks.resident_hashes()) if resync else []
            rates = engine.rates.as_dict()
        return KVEvents(cursor=cursor, resync=resync, resident=resident, rates=rates,
                        events=[KVEvent(seq=e.seq, stored=e.stored, hash=e.block_hash.hex())
                                for e in events])

    @app.get("/stats")
    def stats() -> WorkerStats:
        return snapshot()

    @app.get("/metrics", response_class=Response)
    def prometheus() -> Response:
        """Prometheus text exposition (a thread: the scrape may wait for the engine lock)."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine serves; 503 when its thread died or its steps keep failing
        as a whole (a request failed alone never makes it unhealthy)."""
        ok = loop.healthy
        return JSONResponse({"ok": ok, "role": control.role}, status_code=200 if ok else 503)

    # len() of the scheduler's list and of the pending dict is safe without the engine lock
    install(app, control, lambda: (len(loop.pending), len(engine.scheduler.waiting)))
    return app
