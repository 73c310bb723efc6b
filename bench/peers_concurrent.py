"""Case 3 with several requests in flight on one engine: the trace is handed to the engine
process whole, and the process keeps up to ``concurrency`` of its requests running at once,
a closed loop in arrival order, so that the store serves loads and saves of several requests
together and the engine batches them.

A request starts as soon as a slot is free and the request it follows (``after``: the
previous turn of its chat) has finished; a turn whose previous turn is still running waits,
and the next request in arrival order that may start takes the slot. Each request's time to
first token is measured from its own ``add_request``, in the engine's process; the trace's
wall time from the first ``add_request`` to the last token gives its throughput.

The engine's own prefix cache cannot be reset between requests that overlap (vLLM refuses the
reset while any block is in use), so "only the store remembers" is kept another way: the
store's reader engine for this case runs with vLLM's prefix caching off
(``enable_prefix_caching=False``), so every prompt token that is not computed came from the
store; no cache is the engine without a connector with each request skipping its prefix
cache (``SamplingParams.skip_reading_prefix_cache``); the limit is that engine reading its
own cache, which it keeps over the whole trace.
"""

from __future__ import annotations

import time
from typing import Any

READER_ARGS = {"enable_prefix_caching": False}  # a store's reader engine in this case


def serve_trace(llm: Any, cmd: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``cmd["requests"]`` (``prompt``, ``max_tokens``, ``after``: the position in the list
    of the request that must finish first, or None) with up to ``cmd["concurrency"]`` in
    flight; per request its seconds to the first token and in all, its tokens and the prompt
    tokens it did not compute, and the whole trace's ``wall`` seconds."""
    from vllm import SamplingParams

    reqs: list[dict[str, Any]] = cmd["requests"]
    engine = llm.llm_engine
    pending = list(range(len(reqs)))
    ids: dict[str, int] = {}  # request id (given and as the engine assigned it) -> position
    running: set[int] = set()
    started: dict[int, float] = {}
    first: dict[int, float] = {}
    done: dict[int, dict[str, Any]] = {}
    t0 = time.perf_counter()
    while pending or running:
        while len(running) < cmd["concurrency"]:
            k = next((k for k in pending if reqs[k].get("after") in (None, *done)), None)
            if k is None:
                break
            pending.remove(k)
            sp = SamplingParams(
                max_tokens=reqs[k]["max_tokens"],
                temperature=0.0,
                detokenize=False,
                ignore_eos=True,
                skip_reading_prefix_cache=bool(cmd.get("skip_cache")),
            )
            rid = f"{prefix}-{k}"
            ids[rid] = k
            started[k] = time.perf_counter()
            assigned = engine.add_request(rid, {"prompt_token_ids": reqs[k]["prompt"]}, sp)
            ids[str(assigned)] = k
            running.add(k)
        for out in engine.step():
            k = ids[out.request_id]
            now = time.perf_counter()
            if k not in first and out.outputs and out.outputs[0].token_ids:
                first[k] = now - started[k]
            if out.finished:
                running.discard(k)
                done[k] = {
                    "ttft": first[k],
                    "seconds": now - started[k],
                    "tokens": list(out.outputs[0].token_ids),
                    "cached": out.num_cached_tokens or 0,
                }
    return {"results": [done[k] for k in range(len(reqs))], "wall": time.perf_counter() - t0}
