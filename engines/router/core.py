"""KV-aware routing over engine workers.

The router hashes each prompt with the workers' recipe (block size, algorithm, seed from their
``/info``) and asks its policy (:mod:`engines.router.policies`) to rank the live workers. The
default, ``kv``, sends the request where its first token comes soonest by the cost model of
:mod:`engines.router.cost`: the prefix the worker holds in its own paged cache (known from its
residency events, :mod:`engines.router.workers`, and from the requests already sent there),
the prefix kvstore holds (any worker can load it instead of computing), and the work the
router has queued there, each priced with the prefill, decode and load rates the worker
measured. ``round-robin``, ``least-loaded`` and ``session`` (affinity) are the baselines.

Ranking is :mod:`engines.router.planning`, HTTP to a worker :mod:`engines.router.forward`. A
worker that refuses a connection, or answers 5xx and then fails its ``/health`` too, is
skipped for ``RETRY_S`` (until the poller sees ``/health`` answer again) and the request goes
to the next-best one. A 5xx from a worker whose ``/health`` is fine is that request's failure
alone: the client gets it, the worker stays up, and the request is not tried elsewhere; a 4xx
(the request is invalid) passes to the client as is. Prefill workers disaggregate generation
(:mod:`engines.disagg`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable

import httpx
from pydantic import ValidationError

from engines import disagg
from engines.access import bearer
from engines.messages import FirstToken, GenerateReply, GenerateRequest, RouterStats, WorkerInfo
from engines.router import forward
from engines.router import workers as worker_view
from engines.router.accounts import Accounts
from engines.router.cost import CostModel
from engines.router.forward import (
    FAILURES,
    RequestFailed,
    Routed,
    Streamed,
    WorkerDown,
    WrongRole,
)
from engines.router.planning import Plan, Planner
from engines.router.policies import POLICIES, Ask
from engines.router.workers import POLL_S, RETRY_S, Worker
from engines.store_io import BlockStore, open_store
from kvstore.cluster.view import ClusterView
from kvstore.keys import BlockHasher

__all__ = ["POLICIES", "POLL_S", "RETRY_S", "NoWorker", "Plan", "RequestFailed", "Routed",
           "Router", "Worker", "WorkerDown", "WrongRole"]

log = logging.getLogger(__name__)


class NoWorker(Exception):
    """No live worker is left for the request."""


class Router:
    """Routing state and retries over the workers (ranking: :mod:`.planning`, HTTP:
    :mod:`.forward`, counts: :mod:`.accounts`); owned by one asyncio loop."""

    def __init__(self, workers: list[str], *, prefill_workers: list[str] | None = None,
                 policy: str = "kv", kvstore: str | BlockStore | None = None,
                 load_weight: float | None = None, store_weight: float | None = None,
                 timeout: float = 600.0, worker_token: str | None = None,
                 cluster: ClusterView | None = None) -> None:
        if not workers:
            raise ValueError("the router needs at least one worker")
        self.workers = [Worker(u.rstrip("/")) for u in workers]
        self.prefill = [Worker(u.rstrip("/"), role="prefill") for u in prefill_workers or []]
        self.policy = policy
        self.store = open_store(kvstore) if isinstance(kvstore, str) else kvstore
        self.planner = Planner([self.workers, self.prefill], policy,
                               CostModel(load_weight=load_weight, store_weight=store_weight),
                               self.store, cluster)
        # every call to a worker presents the workers' token (engines.access)
        self.client = httpx.AsyncClient(timeout=timeout, headers=bearer(worker_token))
        self.hasher: BlockHasher | None = None
        self.namespace = ""
        self.index_namespace = ""  # the namespace as kvstore's cluster index names it
        self.model_id = ""
        self.block_bytes = 0
        self.max_model_len = 0  # tokens, prompt and output (0: not told)
        self._poller: asyncio.Task[None] | None = None
        self.accounts = Accounts()
        # (seconds since the request or the last token, first?) per streamed token: /metrics
        self.token_observers: list[Callable[[float, bool], None]] = []

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self, poll: bool = True) -> None:
        """Ask every worker for ``/info`` once (its role; the hash recipe from the first that
        answers) and start the background poller, which keeps asking the ones that did not
        answer: the router serves as soon as one does, and answers 503 until then."""
        await asyncio.gather(*(self.learn(w) for w in self.workers + self.prefill))
        if self.hasher is None:
            log.warning("no worker answered /info yet (%s); retrying every %.0f s",
                        ", ".join(w.url for w in self.workers), POLL_S)
        if poll:
            self._poller = asyncio.create_task(worker_view.poll_forever(
                self.client, lambda: self.workers + self.prefill, self.sync, self.learn))

    async def learn(self, w: Worker) -> bool:
        """Ask ``w`` for ``/info``: its role, and the hash recipe if none is known yet.
        False (and ``w`` left unknown) when it does not answer."""
        try:
            r = await self.client.get(f"{w.url}/info", timeout=2.0)
            r.raise_for_status()
            info = WorkerInfo.model_validate_json(r.content)
            role = info.role
            w.rates = info.rates or w.rates
            w.node = info.kvstore_node
            if self.hasher is None:
                self.hasher = BlockHasher(info.hash_algo, info.hash_seed, info.block_size)
                self.namespace, self.model_id = info.namespace, info.model_id
                self.index_namespace = info.kvstore_namespace or info.namespace
                self.block_bytes = info.block_bytes
                self.max_model_len = info.max_model_len
        except (httpx.HTTPError, ValidationError):  # no answer, or not a worker's
            if not w.known:  # a known worker's role stays as last heard; /health judges it
                w.mark_unknown()
            return False
        if not w.known or w.role != role:
            log.info("worker %s answered (role %s)", w.url, role)
        w.mark_known(role)
        worker_view.place(w, self.workers, self.prefill)
        return True

    def check_ready(self, pool: list[Worker] | None = None) -> None:
        """Raise :class:`NoWorker` (with what the router is waiting for) when no worker of
        ``pool`` (the decode-capable workers by default) could take a request now."""
        pool = self.workers if pool is None else pool
        now = time.monotonic()
        if self.hasher is not None and any(w.available(now) for w in pool):
            return
        kind = "prefill worker" if pool is self.prefill else "worker"
        states = ", ".join(f"{w.url} {'down' if w.known else 'not answering yet'}" for w in pool)
        raise NoWorker(f"no {kind} is up ({states}); the router keeps retrying them every "
                       f"{POLL_S:.0f} s")

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self.client.aclose()
        if self.store is not None and hasattr(self.store, "close"):
            self.store.close()

    # -- routing ------------------------------------------------------------------------------
    async def rank(self, pool: list[Worker], hashes: list[bytes], n_tokens: int,
                   max_tokens: int, session: str | None = None) -> Plan:
        """Live workers of ``pool``, best first, with the work the request adds to each
        (:mod:`.planning`). Raises :class:`NoWorker` when none is live."""
        self.check_ready(pool)
        assert self.hasher is not None
        ask = Ask(hashes, n_tokens, max_tokens, session, 0, self.hasher.block_size,
                  block_bytes=self.block_bytes)
        return await self.planner.rank(pool, ask, self.namespace, self.index_namespace)

    async def generate(self, req: GenerateRequest,
                       session: str | None = None) -> Routed[GenerateReply]:
        """Forward one non-streaming generation (``session``: the key of affinity routing);
        retries on the next worker when one fails. Raises :class:`NoWorker` when none can
        serve it."""
        plan = await self._plan(req, session)
        for w in plan.order:
            try:
                reply = await self._attempt(w, req, plan)
            except WorkerDown:
                self.accounts.retried()
                continue
            self._account(w, req, reply.cached_tokens, plan.store_blocks)
            return Routed(w.url, reply)
        self.accounts.failed()
        raise NoWorker("every worker failed")

    async def stream(self, req: GenerateRequest,
                     session: str | None = None) -> AsyncGenerator[Routed[Streamed], None]:
        """Forward a streaming generation: yields the worker's events (the first token with
        the prompt's prefix hit, a token each, then the reply), each with the worker. Falls
        back to another worker only before the first token. The request counts as served at
        its first token, so a caller may stop reading (and close this generator) at any
        point after it."""
        last = time.perf_counter()
        plan = await self._plan(req, session)
        for w in plan.order:
            started = False
            job = plan.work[w]
            w.begin(job)
            try:
                sent = await self._body_for(req, plan.hashes)
                async with contextlib.aclosing(
                        forward.stream(self.client, w.url, sent)) as events:
                    async for event in events:
                        if not isinstance(event, GenerateReply):  # a token
                            now = time.perf_counter()
                            for observe in self.token_observers:
                                observe(now - last, not started)
                            last = now
                            if not started:
                                started = True
                                w.first_token(job)
                                hit = event.cached_tokens if isinstance(event, FirstToken) else 0
                                self._account(w, req, hit, plan.store_blocks)
                        yield Routed(w.url, event)
                return
            except (WorkerDown, *FAILURES) as exc:
                if started:
                    raise
                await self._failed(w, exc)
                self.accounts.retried()
            finally:
                w.end(job)
                await self.sync(w)
        self.accounts.failed()
        raise NoWorker("every worker failed")

    async def sync(self, w: Worker) -> None:
        """Pull ``w``'s residency events since the last pull."""
        await worker_view.sync(self.client, w)

    def stats(self) -> RouterStats:
        return self.accounts.stats(self.policy, self.workers + self.prefill)

    # -- internals ----------------------------------------------------------------------------
    async def _plan(self, req: GenerateRequest, session: str | None) -> Plan:
        self.check_ready()
        assert self.hasher is not None
        # the salt enters the first block's hash, as on the workers: a salted prompt matches
        # only prefixes cached under the same salt, here and in kvstore
        hashes: list[bytes] = list(self.hasher.hash_blocks(
            req.prompt_ids, cache_salt=req.cache_salt))
        return await self.rank(self.workers, hashes, len(req.prompt_ids), req.max_tokens,
                               session)

    async def _body_for(self, req: GenerateRequest, hashes: list[bytes]) -> GenerateRequest:
        """The decode worker's request: with prefill workers, run the prefill first and
        attach the handoff."""
        if not self.prefill:
            return req
        plan = await self.rank(self.prefill, hashes, len(req.prompt_ids), 0)
        for p in plan.order:
            try:
                handoff = await disagg.prefill(self.client, p.url, req.prompt_ids,
                                               req.cache_salt)
            except httpx.HTTPStatusError as exc:
                if forward.wrong_role(exc.response):
                    await self.learn(p)
                    continue
                if exc.response.status_code < 500:
                    raise
                await self._failed(p, WorkerDown(str(exc)))
                continue
            except FAILURES as exc:
                self._mark_down(p, exc)
                continue
            p.routed += 1
            await self.sync(p)
            return disagg.decode_request(handoff, req)
        raise NoWorker("every prefill worker failed")

    async def _attempt(self, w: Worker, req: GenerateRequest, plan: Plan) -> GenerateReply:
        job = plan.work[w]
        w.begin(job)
        try:
            sent = await self._body_for(req, plan.hashes)
            return await forward.generate(self.client, w.url, sent)
        except (WorkerDown, *FAILURES) as exc:
            await self._failed(w, exc)
            raise WorkerDown(str(exc)) from exc
        finally:
            w.end(job)
            await self.sync(w)

    def _account(self, w: Worker, req: GenerateRequest, hit: int, stored: int) -> None:
        assert self.hasher is not None
        self.accounts.served(w, hit, len(req.prompt_ids), stored * self.hasher.block_size)

    async def _failed(self, w: Worker, exc: Exception) -> None:
        """A worker that could not take a request: relearn a switched role; a 5xx from a
        worker whose ``/health`` is fine raises :class:`RequestFailed` (the request's own
        failure: no retry, the worker stays up); else mark the worker down (the caller
        tries the next one)."""
        if isinstance(exc, WrongRole):
            await self.learn(w)
            return
        if isinstance(exc, WorkerDown) and await forward.healthy(self.client, w.url):
            self.accounts.failed()
            raise RequestFailed(f"worker {w.url} failed this request: {exc}") from exc
        self._mark_down(w, exc)

    def _mark_down(self, w: Worker, why: object = None) -> None:
        log.warning("worker %s is down: %s", w.url, why)
        w.mark_down()
