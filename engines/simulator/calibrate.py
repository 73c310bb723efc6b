"""The simulator's rates measured from a real worker (``kvstore-engine serve``), by probing
it with requests that share nothing.

- prefill: the worker's own time to first token (``ttft_s``) of a short and a long prompt
  alone; the slope is the prefill rate;
- decode: the mean gap between tokens of one request alone (a step's overhead plus one
  sequence) and of ``batch`` requests decoding together (the overhead plus ``batch``
  sequences); the slope is the marginal decode rate, the rest the step overhead;
- request overhead: what the client waits beyond the worker's own latency (HTTP), or with
  :func:`measure_route` beyond the engine's step on the clients' own path (the router);
- load: the worker's measured rate from ``/info`` (a worker without kvstore has none, and the
  default stays).

Each figure is the median of ``repeats`` probes. The worker must be idle meanwhile.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from engines.messages import GenerateReply, GenerateRequest, WorkerInfo, read_event
from engines.simulator.rates import SimRates

MIN_GAP_S = 1e-6  # below this a slope is noise: the rate is taken as unbounded
UNBOUNDED = 1e9  # tokens/s standing for "costs nothing measurable"


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def _generate(client: httpx.Client, url: str, prompt: list[int],
              max_tokens: int) -> tuple[GenerateReply, float]:
    """One generation streamed as the router asks for it (an SSE event per token, which costs
    the worker time too); the worker's reply and the client's wall time."""
    started = time.perf_counter()
    req = GenerateRequest(prompt_ids=prompt, max_tokens=max_tokens, ignore_eos=True,
                          temperature=0, stream=True)
    reply: GenerateReply | None = None
    with client.stream("POST", f"{url}/generate", content=req.wire(),
                       headers={"content-type": "application/json"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = read_event(line[6:])
                reply = event if isinstance(event, GenerateReply) else reply
    if reply is None or reply.ttft_s is None:
        raise RuntimeError(f"{url}/generate streamed no reply with a first token")
    return reply, time.perf_counter() - started


def _ttft(reply: GenerateReply) -> float:
    assert reply.ttft_s is not None  # _generate refuses a reply without one
    return reply.ttft_s


def _itl(reply: GenerateReply, max_tokens: int) -> float:
    return (reply.latency_s - _ttft(reply)) / (max_tokens - 1)


def measure(url: str, *, short: int = 16, long: int = 240, tokens: int = 32, batch: int = 8,
            repeats: int = 3, vocab: int = 90, seed: int = 0,
            max_batch_tokens: int = 512) -> SimRates:
    """Probe the idle worker at ``url``. ``long`` is best near the traffic's mean prompt (a
    step's cost grows with the context it attends over, which a rate averages) and must fit
    the worker's cache; ``max_batch_tokens`` is the worker's (a prompt longer than it takes
    one step, with its overhead, per chunk)."""
    rng = random.Random(seed)
    with httpx.Client(timeout=120) as client:
        _generate(client, url, _prompt(rng, long, vocab), tokens)  # warm-up
        ttft: dict[int, list[float]] = {short: [], long: []}
        alone, together, http = [], [], []
        for _ in range(repeats):
            for n in (short, long):
                reply, wall = _generate(client, url, _prompt(rng, n, vocab), 1)
                ttft[n].append(_ttft(reply))
                http.append(wall - reply.latency_s)
            reply, _ = _generate(client, url, _prompt(rng, short, vocab), tokens)
            alone.append(_itl(reply, tokens))
            with ThreadPoolExecutor(batch) as pool:
                docs = list(pool.map(lambda p: _generate(client, url, p, tokens)[0],
                                     [_prompt(rng, short, vocab) for _ in range(batch)]))
            together.append(statistics.median(_itl(d, tokens) for d in docs))
        info = WorkerInfo.model_validate_json(client.get(f"{url}/info").content)
    one, many = statistics.median(alone), statistics.median(together)
    decode = (batch - 1) / (many - one) if many - one > MIN_GAP_S else UNBOUNDED
    overhead = max(0.0, one - 1 / decode)
    chunks = -(-long // max_batch_tokens) - -(-short // max_batch_tokens)
    gap = statistics.median(ttft[long]) - statistics.median(ttft[short]) - chunks * overhead
    prefill = (long - short) / gap if gap > MIN_GAP_S else UNBOUNDED
    return SimRates.from_dict({
        "prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode,
        "load_tokens_per_s": info.rates.get("load_tokens_per_s"), "step_overhead_s": overhead,
        "request_overhead_s": max(0.0, statistics.median(http))})


def measure_route(url: str, rates: SimRates, *, n: int = 16, repeats: int = 5,
                  vocab: int = 90, seed: int = 1) -> SimRates:
    """``rates`` with ``request_overhead_s`` measured on the path clients take: short fresh
    prompts streamed through ``url``'s ``/v1/completions`` (a router, usually), each one's
    time to its first token less the one step the engine spends on it. Sequential, on an
    idle fleet."""
    rng = random.Random(seed)
    waits = []
    with httpx.Client(timeout=120) as client:
        for i in range(repeats + 1):
            body = {"prompt": _prompt(rng, n, vocab), "max_tokens": 2, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            started = time.perf_counter()
            with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        break
            if i:  # the first warms the connection and the router's view
                waits.append(time.perf_counter() - started)
    engine = rates.step_seconds(n, 0)
    return dataclasses.replace(rates, request_overhead_s=max(0.0, statistics.median(waits)
                                                             - engine))
