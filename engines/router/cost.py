"""The KV-aware router's cost model: the seconds a request would wait for its first token on a
worker, priced with the rates the workers measured (:mod:`engines.decoder.rates`).

For a prompt of ``n`` tokens whose first ``local`` blocks the worker holds and whose first
``store`` blocks kvstore holds (block size ``bs``)::

    compute(w) = max(1, n - bs * max(local, store))       tokens the worker must prefill
    load(w)    = bs * max(0, store - local)                tokens it loads from kvstore
    ahead(w)   = pending_prefill(w) / P + decoding(w) / D
    cost(w)    = ahead(w) + compute(w) / P + load(w) / L

``P``, ``D`` and ``L`` are the fleet's prefill, decode and load rates (tokens/s): the medians
of what its workers measured. With a cluster of kvstore nodes (``kvstore-router --cluster``),
``store`` is the prefix held on any node and ``near(w)`` the one ``w``'s own node holds; the
blocks between cost a peer read more each::

    load(w)    = bs * max(0, near - local) / L + bs * max(0, store - max(near, local)) * (1/L + X)

with ``X`` the seconds per token of reading a block from another node, from the peer read rate
the nodes measure (``block_bytes / bs / rate``; until one has, ``1/(2L)``: half a load more);
``pending_prefill`` is the prefill the router has sent there that has not produced its first
token yet (it runs before ours), ``decoding`` the requests there past their first token (with
continuous batching each adds a decode token to every step ours runs in). In prefill tokens,
that is an overlap credit of ``bs`` per local block and ``bs * (1 - P / L)`` per block only
kvstore holds (the store weight), against a load weight of 1 per queued prefill token and
``P / D`` per decoding request: all follow from measured rates, none is set by hand. With
nothing measured anywhere, prefill and decode are priced alike and a load at half a prefill.

Why the fleet's medians and not each worker's own rates: a worker's rates move with what its
last steps held and with whatever else shares its machine (measured on the routing bench: one
worker's prefill rate between 490 and 1,440 tokens/s within a minute, the four of a pool as
far apart at one moment), and an idle worker's stay as they were when it last worked. Priced
by its own rates, the worker that happened to measure fastest took the requests the others'
caches did not favour until its queue made up the difference; with kvstore behind the pool,
where every worker's cache is as good, up to 65% of a pool's requests went to one of four
workers. Priced by the medians, the bench's TTFT p50 beat every other policy's in each
repetition (it had not against least-loaded). The price of this choice: workers that truly
differ in speed are priced alike; the queue term still steers work away from a slow worker as
its queue grows, and a mixed fleet is best served by one router per kind of worker. Two
overrides exist for experiments: ``store_weight`` fixes the store credit fraction (``1 - P/L``)
and ``load_weight`` scales ``ahead``.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from engines.router.workers import Worker

RATE_KEYS = ("prefill_tokens_per_s", "decode_tokens_per_s", "load_tokens_per_s")


class Prices(NamedTuple):
    """Seconds per token of one worker's prefill, decode and kvstore load."""

    prefill: float
    decode: float
    load: float


class CostModel:
    """Prices requests on workers; reads worker rates, mutates nothing."""

    def __init__(self, *, load_weight: float | None = None,
                 store_weight: float | None = None) -> None:
        if store_weight is not None and not 0 <= store_weight <= 1:
            raise ValueError("store_weight must be in [0, 1]")
        if load_weight is not None and load_weight < 0:
            raise ValueError("load_weight must be >= 0")
        self.load_weight, self.store_weight = load_weight, store_weight

    def prices(self, workers: list[Worker]) -> dict[Worker, Prices]:
        """Each worker's prices: the fleet's median rates (see the module doc), else the
        prior."""
        fleet = {k: statistics.median(v) for k in RATE_KEYS
                 if (v := [r for w in workers if (r := w.rates.get(k))])}
        p, d, ld = (fleet.get(k) for k in RATE_KEYS)
        prefill_s = 1.0 / p if p else 1.0
        decode_s = 1.0 / d if d else prefill_s
        load_s = 1.0 / ld if ld else prefill_s / 2
        if self.store_weight is not None:
            load_s = (1.0 - self.store_weight) * prefill_s
        price = Prices(prefill_s, decode_s, min(load_s, prefill_s))
        return dict.fromkeys(workers, price)

    def cost(self, w: Worker, price: Prices, *, n_tokens: int, local: int, store: int,
             block_size: int, near: int | None = None, peer_s: float | None = None) -> float:
        """Seconds until ``w`` would emit the request's first token (see the module doc).
        In a cluster ``near`` is the prefix ``w``'s own kvstore node holds (``store`` the one
        held anywhere): blocks beyond it come from another node, at ``peer_s`` more per token
        (measured by the nodes; before that, half a load more)."""
        compute = max(1, n_tokens - block_size * max(local, store))
        ahead = w.pending_prefill * price.prefill + w.decoding * price.decode
        if self.load_weight is not None:
            ahead *= self.load_weight
        if near is None:
            return ahead + compute * price.prefill + block_size * max(0, store - local) \
                * price.load
        own = block_size * max(0, min(near, store) - local)
        peer = block_size * max(0, store - max(near, local))
        extra = price.load / 2 if peer_s is None else peer_s
        return ahead + compute * price.prefill + own * price.load + peer * (price.load + extra)
