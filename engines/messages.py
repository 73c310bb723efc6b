"""What a worker and its callers (the router, the SLO planner, the calibrator) say to each
other, one type per message, used by both sides: the worker answers with these models and the
callers validate what they read with the same ones, so that a field renamed on one side fails
on the other at once, and a worker that answers with something else is one clear error.

- ``GET /info`` -> :class:`WorkerInfo`: role, the hash recipe, the cache's shape, the rates.
- ``GET /kv/events?since=N`` -> :class:`KVEvents`: residency changes after cursor ``N``.
- ``POST /prefill`` (:class:`PrefillRequest`) -> :class:`PrefillReply`: the handoff.
- ``POST /generate`` (:class:`GenerateRequest`) -> :class:`GenerateReply`; with ``stream``,
  SSE events (:data:`GenerateEvent`, read with :func:`read_event`): a :class:`FirstToken`, a
  :class:`Token` per later token, then the :class:`GenerateReply` or a :class:`StreamError`.
- ``GET /latency?since=N`` -> :class:`LatencyReport`: requests finished after ``N``, the load.
- ``POST /admin/role`` (:class:`RoleRequest`) -> :class:`RoleReply`.
- ``GET /stats`` -> :class:`WorkerStats` (its counters and its engine's, for its exporter).
- the router's ``GET /stats`` -> :class:`RouterStats` (for its exporter and the planner).
"""

from __future__ import annotations

import json

from pydantic import BaseModel, Field

MAX_SALT_CHARS = 1024  # a cache_salt's characters


class WorkerInfo(BaseModel):
    """How to route to a worker and hash for it."""

    role: str = Field(description="both, prefill or decode")
    model_id: str
    block_size: int = Field(description="tokens per block")
    hash_algo: str
    hash_seed: str | None
    namespace: str = Field(description="the kvstore namespace its blocks go to")
    block_bytes: int
    num_blocks: int
    kvstore: bool = Field(description="whether it saves to and loads from kvstore")
    device: str
    rates: dict[str, float | None] = Field(
        description="its measured prefill, decode and load rates (None: not measured yet)")
    max_model_len: int = Field(description="the longest sequence it serves, in tokens")
    kvstore_node: str | None = Field(None, description="the cluster node id of its kvstore "
                                     "server (none: no kvstore, or a node alone)")
    kvstore_namespace: str | None = Field(
        None, description="the name its kvstore (and a cluster's block index) knows its "
        "namespace by: tenant~name under a tenant token (none: no kvstore)")


class KVEvent(BaseModel):
    """A block that became resident (``stored``) in a worker's cache, or left it."""

    seq: int
    stored: bool
    hash: str = Field(description="the block hash, hex")


class KVEvents(BaseModel):
    """Residency events after the cursor asked for. ``resync`` is true (and ``resident``
    lists every resident hash) when events the caller has not seen were dropped."""

    cursor: int
    resync: bool
    resident: list[str]
    rates: dict[str, float | None]
    events: list[KVEvent]


class PrefillRequest(BaseModel):
    prompt_ids: list[int] = Field(min_length=1)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_SALT_CHARS)


class PrefillReply(BaseModel):
    """The handoff: the blocks a prefill worker computed and stored, for a decode worker."""

    prompt_ids: list[int]
    block_hashes: list[str] = Field(description="hex, in chain order")
    namespace: str
    first_token: int
    cached_tokens: int
    latency_s: float


class GenerateRequest(BaseModel):
    """A generation: the prompt, its sampling (the sampler's own rules: finite, temperature
    >= 0, ``top_p`` in (0, 1]), and with a disaggregated handoff the prompt's block hashes."""

    prompt_ids: list[int] = Field(min_length=1)
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = []
    stream: bool = False
    block_hashes: list[str] | None = Field(default=None, description="hex, from a prefill worker")
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_SALT_CHARS)

    def wire(self) -> str:
        """The JSON body: the fields the sender set (an unset one takes its default)."""
        return self.model_dump_json(exclude_unset=True)


class PrefixHit(BaseModel):
    """A prompt's size and prefix hit, and where its time to the first token went:
    ``queue_s`` from submission to joining the batch (loads aside), ``load_s`` loading from
    kvstore, ``prefill_s`` from joining the batch to the first token."""

    prompt_tokens: int
    cached_tokens: int = Field(description="local_hit_tokens + store_hit_tokens")
    local_hit_tokens: int
    store_hit_tokens: int
    ttft_s: float | None
    queue_s: float | None
    load_s: float
    prefill_s: float | None

    def hit(self) -> PrefixHit:
        """These fields alone (without what a subclass adds)."""
        return PrefixHit.model_validate(self.model_dump(include=set(PrefixHit.model_fields)))


class Token(BaseModel):
    """A streamed token after the first."""

    token_id: int


class FirstToken(PrefixHit):
    """A stream's first token, with the prompt's prefix hit (final once it is out)."""

    token_id: int


class GenerateReply(PrefixHit):
    """A finished generation: its tokens, why it ended, the prefix hit and the latency."""

    token_ids: list[int]
    finish_reason: str | None
    latency_s: float


class StreamError(BaseModel):
    """A streamed generation that failed after its answer started."""

    error: str


GenerateEvent = FirstToken | Token | GenerateReply | StreamError


def read_event(data: str | bytes) -> GenerateEvent:
    """One streamed event from its JSON (an SSE line's ``data``); ``ValueError`` when it is
    none of them."""
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"a generate event is an object, not {type(doc).__name__}")
    kind: type[GenerateEvent]
    if "token_id" in doc:
        kind = FirstToken if "cached_tokens" in doc else Token
    else:
        kind = StreamError if "error" in doc else GenerateReply
    return kind.model_validate(doc)


class FinishedRow(BaseModel):
    """One finished request as the planner sees it."""

    seq: int = Field(description="its cursor")
    at: float = Field(description="time.time() at the end")
    kind: str = Field(description="prefill or generate")
    ttft_s: float
    itl_s: float | None = Field(description="mean gap between output tokens; None with one")
    tokens: int


class LatencyReport(BaseModel):
    """Requests finished after the cursor asked for, and the load now."""

    cursor: int
    role: str
    finished: list[FinishedRow]
    inflight: int = Field(description="requests in the engine")
    waiting: int = Field(description="requests waiting to join the batch")


class RoleRequest(BaseModel):
    role: str = Field(description="both, prefill or decode")


class RoleReply(BaseModel):
    role: str
    previous: str
    switches: int


class RoutedWorker(BaseModel):
    """One worker as the router sees it (a row of :class:`RouterStats`)."""

    role: str
    up: bool
    inflight: int = Field(description="requests running")
    queued_tokens: int = Field(description="estimated tokens of work running")
    rates: dict[str, float | None]
    routed: int
    failures: int
    prompt_tokens: int = Field(description="prompt tokens routed to it")
    hit_tokens: int = Field(description="prefix tokens it did not compute")
    resident_blocks: int = Field(description="blocks the router knows it holds")


class RouterStats(BaseModel):
    """The router's ``GET /stats``: its totals, the prefix hit rate and each worker by URL
    (read by its Prometheus exporter and by the SLO planner)."""

    policy: str
    requests: int
    failed: int = Field(description="requests no worker served")
    retries: int = Field(description="attempts moved to another worker")
    prompt_tokens: int
    hit_tokens: int
    store_prefix_tokens: int = Field(description="prompt tokens kvstore held when routed")
    prefix_hit_rate: float
    workers: dict[str, RoutedWorker]


class ConnectorCounts(BaseModel):
    """What an engine's kvstore connector did: lookups, blocks the store held, loaded into the
    cache and saved from it, and store errors (each one a miss or a dropped save)."""

    lookups: int
    hit_blocks: int
    loaded_blocks: int
    saved_blocks: int
    errors: int


class EngineStats(BaseModel):
    """An engine's counters (tokens by where their KV came from, preemptions, steps) and its
    batch and cache now."""

    prompt_tokens: int
    local_hit_tokens: int = Field(description="prompt tokens found in its own cache")
    store_hit_tokens: int = Field(description="prompt tokens loaded from kvstore")
    computed_tokens: int
    preemptions: int
    steps: int
    free_blocks: int
    running: int
    waiting: int
    rates: dict[str, float | None]
    kvstore: ConnectorCounts | None = Field(default=None,
                                            description="absent for an engine without kvstore")


class WorkerStats(BaseModel):
    """A worker's ``GET /stats``: its role, request and token counters, and its engine's."""

    role: str
    requests: int
    prefills: int
    generated_tokens: int
    cached_tokens: int
    role_switches: int
    engine: EngineStats
    inflight: int = Field(description="requests in the engine")
