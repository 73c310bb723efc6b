"""The S3 catalog without a server: writes made under the tier's lock commit together on
release (other threads see none of them before), changes net out, a temporary catalog is
removed at close."""

from __future__ import annotations

import os
import random
import threading

from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3.holdings import Holdings
from kvstore.tiers.s3.layout import Where

META = BlockMeta(7, 8, 10)


def k(i: int) -> tuple[str, bytes]:
    return "ns", bytes([i]) * 8


def _seen_from_another_thread(held: Holdings, i: int) -> bool:
    out: list[bool] = []
    thread = threading.Thread(target=lambda: out.append(k(i) in held))
    thread.start()
    thread.join()
    return out[0]


def test_writes_under_the_lock_commit_together_on_release() -> None:
    held = Holdings()
    with held.lock:
        held.hold(k(1), META, Where(k(1), 0))
        assert k(1) in held and held.metas([k(1)]) == [META]  # the holder sees its writes
        assert not _seen_from_another_thread(held, 1)  # others see the last commit
    assert _seen_from_another_thread(held, 1)
    held.close()


def test_changes_net_out_and_drain_once() -> None:
    held = Holdings()
    with held.lock:
        held.hold(k(1), META, Where(k(1), 0))
        held.adopted(k(1), META)
        held.hold(k(2), META, Where(k(2), 0))
        held.adopted(k(2), META)
        assert held.lose(k(2)) == [k(2)]  # adopted, then lost before the store looked
        held.hold(k(3), META, Where(k(3), 0))
        assert held.changes() == [(k(1), META, True)]
        assert held.lose(k(3)) == [k(3)]  # put by the store, then lost
        assert held.changes() == [(k(3), META, False)]
        assert held.changes() == []
    held.close()


def test_a_temporary_catalog_is_removed_at_close() -> None:
    held = Holdings()
    path = held.file.path
    assert os.path.isdir(path) and not held.file.persistent
    held.close()
    held.close()  # idempotent
    assert not os.path.exists(path)


def test_sample_draws_held_keys() -> None:
    held = Holdings()
    with held.lock:
        for i in range(40):
            held.hold(k(i), META, Where(k(i), 0))
    rng = random.Random(1)
    assert set(held.sample(100, rng)) == {k(i) for i in range(40)}  # n >= len: every key
    drawn = held.sample(8, rng)
    assert drawn and set(drawn) <= {k(i) for i in range(40)}
    held.close()
