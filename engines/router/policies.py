"""The routing policies: given the live workers (in a rotation that changes every request) and
what the router knows of a request, the workers best first.

- ``kv`` (the default): the lowest cost of :mod:`engines.router.cost`, the seconds to the
  first token from the worker's cached prefix, kvstore's, and the work queued there;
- ``round-robin``: the rotation as it is (the baseline);
- ``least-loaded``: the fewest queued tokens (prompt plus ``max_tokens`` of the requests the
  router has running on each worker);
- ``session``: consistent hashing of the session id (OpenAI's ``user`` field; without one, the
  prompt's first block) on a ring of ``VNODES`` points per worker, so a session stays on its
  worker and only the sessions of a worker that leaves move.

Ties keep the rotation (``sorted`` is stable), so equal workers share the load.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from engines.router.cost import CostModel
from engines.router.workers import Worker

VNODES = 64  # ring points per worker: spreads sessions evenly over few workers


class Ask(NamedTuple):
    """What the router knows of a request when it ranks workers."""

    hashes: list[bytes]  # the prompt's full-block hashes
    n_tokens: int
    max_tokens: int
    session: str | None
    store: int  # prompt blocks kvstore holds (0 when the policy does not look)
    block_size: int
    # in a cluster: each kvstore node's own prefix of the prompt (by node id), and the extra
    # seconds per token of a block read from another node (None: not measured)
    near: Mapping[str, int] | None = None
    peer_s: float | None = None
    block_bytes: int = 0


class Policy(Protocol):
    uses_store: bool  # whether ``Ask.store`` must be looked up

    def rank(self, live: list[Worker], ask: Ask) -> list[Worker]: ...


class RoundRobin:
    uses_store = False

    def rank(self, live: list[Worker], ask: Ask) -> list[Worker]:
        return live


class LeastLoaded:
    uses_store = False

    def rank(self, live: list[Worker], ask: Ask) -> list[Worker]:
        return sorted(live, key=lambda w: w.queued)


class SessionAffinity:
    """Consistent hashing on the session id over every configured worker (up or not)."""

    uses_store = False

    def __init__(self, workers: list[Worker]) -> None:
        points = sorted((_point(f"{w.url}#{i}"), j) for j, w in enumerate(workers)
                        for i in range(VNODES))
        self.keys = [p for p, _ in points]
        self.owners = [workers[j] for _, j in points]

    def rank(self, live: list[Worker], ask: Ask) -> list[Worker]:
        key = ask.session or (ask.hashes[0].hex() if ask.hashes else "")
        start = bisect.bisect(self.keys, _point(key))
        alive = set(live)
        out: list[Worker] = []
        seen: set[Worker] = set()
        n = len(self.owners)
        for i in range(n):  # clockwise from the key: the successors in turn
            w = self.owners[(start + i) % n]
            if w in alive and w not in seen:
                out.append(w)
                seen.add(w)
                if len(out) == len(alive):  # every live worker placed: the rest of the
                    break  # ring (VNODES points per worker) can add nothing
        return out + [w for w in live if w not in seen]


class KVAware:
    uses_store = True

    def __init__(self, model: CostModel) -> None:
        self.model = model

    def rank(self, live: list[Worker], ask: Ask) -> list[Worker]:
        prices = self.model.prices(live)
        near = ask.near
        cost = {w: self.model.cost(w, prices[w], n_tokens=ask.n_tokens,
                                   local=w.local_prefix(ask.hashes), store=ask.store,
                                   block_size=ask.block_size,
                                   near=None if near is None else near.get(w.node or "", 0),
                                   peer_s=ask.peer_s) for w in live}
        return sorted(live, key=cost.__getitem__)


POLICIES = ("kv", "round-robin", "least-loaded", "session")


def make_policy(name: str, workers: list[Worker], model: CostModel) -> Policy:
    """The policy called ``name`` (one of :data:`POLICIES`); ``ValueError`` otherwise."""
    if name == "kv":
        return KVAware(model)
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return LeastLoaded()
    if name == "session":
        return SessionAffinity(workers)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


def _point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
