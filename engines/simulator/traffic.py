"""The traffic a simulation serves, sized as ``bench/engine_routing.py`` sizes the real one:
the same workload shape, the same per-worker cache share of the shared prefixes, the same
goodput targets (multiples of the latency of a mean-sized request without queueing: here on
one idle worker, as simulated workers share no CPU) and an arrival rate set to a fraction
(``load``) of the fleet's capacity at the reuse bound, measured here on the simulated fleet.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import NamedTuple

from engines.simulator.engine import EngineShape
from engines.simulator.fleet import FleetConfig, simulate
from engines.workload import Request, WorkloadConfig, generate, reuse_bound

CACHE_SHARE = 0.14  # of the shared prefixes (system prompts + documents) one worker holds
TTFT_SLO, ITL_SLO = 5.0, 8.0  # goodput targets, as multiples of the idle TTFT and ITL
# The real bench's lengths, as fractions of the full-size traces': prompts at a quarter, so
# that prefill is most of a request's first token (~0.8 s for a mean prompt of ~780 tokens on
# the bench's shared cores, against ~20 ms of HTTP and routing), as on real hardware; outputs
# at a sixteenth, since on this CPU model a decode token costs a step (~25 prefill tokens),
# where an accelerator's batched decoding costs far less next to prefill (Mooncake's mean
# request: 7,590 prompt tokens, 182 output tokens)
SCALE = 1 / 4
OUTPUT_SCALE = 1 / 16


def workload(scale: float = SCALE, outputs: float = OUTPUT_SCALE,
             **changes: object) -> WorkloadConfig:
    """The routing bench's traffic (``bench/engine_routing.py``): prompt lengths times
    ``scale`` of the full-size defaults, output lengths times ``outputs``; ``changes``
    replace fields after scaling."""
    return WorkloadConfig(docs=24, tenants=4, think_s=1.0, chat_share=0.4,
                          rag_share=0.4).scaled(scale, outputs,
                                                max_prompt=round(16384 * scale), **changes)


def cache_blocks(cfg: WorkloadConfig, block_size: int) -> int:
    """A worker's cache: ``CACHE_SHARE`` of the shared prefixes, at least one longest
    request."""
    shared = cfg.tenants * cfg.system_len + cfg.docs * cfg.doc_len
    longest = -(-(cfg.max_prompt + cfg.max_output) // block_size)
    return max(int(shared * CACHE_SHARE) // block_size, longest)


class Targets(NamedTuple):
    """Idle latencies of a mean-sized request and the goodput targets they set."""

    mean_prompt: int
    mean_output: int
    idle_ttft_s: float
    idle_itl_s: float
    ttft_target_s: float
    itl_target_s: float
    capacity_rps: float  # requests/s the fleet completes in a burst without cache hits
    capacity_hit_rps: float  # the same burst again, its prompts cached (all but a block)


def fresh(cfg: WorkloadConfig, n: int, count: int, salt: int = 20_000) -> list[Request]:
    """``count`` requests of ``n`` prompt tokens at time 0, sharing nothing."""
    shape = dataclasses.replace(cfg, sessions=count, chat_share=0, rag_share=0, oneoff_len=n,
                                length_sigma=0.01, salt=salt, session_rate=1e9)
    return [dataclasses.replace(r, at=0.0) for r in generate(shape)]


def targets(cfg: WorkloadConfig, fleet: FleetConfig) -> Targets:
    """Idle TTFT and ITL of a mean-sized request on one worker, the targets, and the
    fleet's capacity: a burst of three mean-sized requests per worker, round-robin, then the
    same burst again once it has ended (each prompt back on the worker that cached it)."""
    reqs = generate(dataclasses.replace(cfg, salt=10_000))
    n = int(statistics.mean(len(r.prompt) for r in reqs))
    out = max(2, int(statistics.mean(r.max_tokens for r in reqs)))
    one = [dataclasses.replace(r, max_tokens=out) for r in fresh(cfg, n, 1)]
    idle = simulate(one, dataclasses.replace(fleet, workers=1, policy="round-robin",
                                             kvstore=False))[0]
    burst = [dataclasses.replace(r, max_tokens=out) for r in fresh(cfg, n, 3 * fleet.workers)]
    rr = dataclasses.replace(fleet, policy="round-robin", kvstore=False)
    first = max(o.end for o in simulate(burst, rr))
    again = [dataclasses.replace(r, index=r.index + len(burst), at=first) for r in burst]
    done = [o for o in simulate(burst + again, rr) if o.request >= len(burst)]
    hit = len(again) / (max(o.end for o in done) - first)
    return Targets(n, out, idle.ttft, idle.itl, TTFT_SLO * idle.ttft, ITL_SLO * idle.itl,
                   len(burst) / first, hit)


def sized(cfg: WorkloadConfig, t: Targets, load: float, sessions: int,
          block_size: int) -> WorkloadConfig:
    """``cfg`` with ``sessions`` sessions arriving at the rate that loads the fleet to
    ``load`` of its capacity if it hit the reuse bound (every prefix seen before reused), as
    the real bench sizes its traffic: a policy that reuses less works harder. A request's
    fleet time is interpolated between the capacities without and with hits by the share of
    its prompt it reuses (reuse saves the prefill, not the decoding)."""
    if load <= 0 or sessions < 1:
        raise ValueError("load must be > 0 and sessions >= 1")
    probe = dataclasses.replace(cfg, sessions=max(sessions, 50))
    reqs = generate(probe)
    per_session = len(reqs) / probe.sessions
    bound = reuse_bound(reqs, block_size)
    per_request_s = (1 - bound) / t.capacity_rps + bound / t.capacity_hit_rps
    rate = load / per_request_s / per_session
    return dataclasses.replace(cfg, session_rate=rate, sessions=sessions)


def default_shape(cfg: WorkloadConfig, block_size: int = 16) -> EngineShape:
    """The real bench's worker flags for ``cfg``."""
    return EngineShape(block_size=block_size, num_blocks=cache_blocks(cfg, block_size),
                       max_batch_tokens=256)
