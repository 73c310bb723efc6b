"""Session affinity's ring walk stops once every live worker is placed: the same ranking as a
walk of the whole ring (``VNODES`` points per worker), in far fewer steps at 128 workers."""

from __future__ import annotations

import random

from engines.router.policies import Ask, SessionAffinity
from engines.router.workers import Worker


def full_walk(policy: SessionAffinity, live: list[Worker], key_start: int) -> list[Worker]:
    out: list[Worker] = []
    for i in range(len(policy.owners)):
        w = policy.owners[(key_start + i) % len(policy.owners)]
        if w in set(live) and w not in out:
            out.append(w)
    return out + [w for w in live if w not in out]


def test_the_early_stop_ranks_as_the_whole_ring_does() -> None:
    import bisect

    from engines.router.policies import _point

    rng = random.Random(7)
    workers = [Worker(url=f"http://10.0.0.{i}:8000") for i in range(128)]
    policy = SessionAffinity(workers)
    for n in range(200):
        live = rng.sample(workers, rng.choice((1, 5, 64, 128)))
        session = f"user-{n}"
        ask = Ask(hashes=[], n_tokens=10, max_tokens=4, session=session, store=0, block_size=4)
        start = bisect.bisect(policy.keys, _point(session))
        ranked = policy.rank(live, ask)
        assert ranked == full_walk(policy, live, start)
        assert sorted(map(id, ranked)) == sorted(map(id, live))  # each live worker once
