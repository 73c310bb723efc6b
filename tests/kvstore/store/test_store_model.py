"""Property test: random sequences of put/get/lookup/pin/release/delete/restart against a
simple reference model (a dict of what was put).

Checked after every step: capacity never exceeded, a get returns exactly the bytes put (or a
miss, only once the store has reported dropping blocks from its last tier), lookup prefix
semantics, pinned blocks never leave the tier they were pinned in, ``check_integrity()``.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Namespace
from kvstore.store import Store

BLOCK = 1024
KEYS = [bytes([i]) * 32 for i in range(24)]
key_index = st.integers(0, len(KEYS) - 1)


def payload(i: int, version: int) -> bytes:
    """Deterministic bytes per (key, version): a re-put after delete may carry new bytes."""
    return (bytes([i, version % 256]) * (BLOCK // 2))


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="kvstore-model-")
        self.model: dict[bytes, bytes] = {}
        self.version: dict[bytes, int] = {}
        self.pinned: dict[bytes, str] = {}  # hash -> tier it was pinned in
        self.store: Store | None = None
        self.prior_dropped = 0

    @initialize(
        host=st.integers(2, 6),
        disk=st.sampled_from([0, 6, 64]),
        policy=st.sampled_from(["lru", "lfu", "s3fifo"]),
        write_through=st.booleans(),
    )
    def open_store(self, host: int, disk: int, policy: str, write_through: bool) -> None:
        tiers = [TierConfig("host", host * BLOCK, policy=policy, options={"slot_bytes": BLOCK})]
        if disk:
            tiers.append(TierConfig("disk", disk * BLOCK, policy=policy,
                                    write_through=write_through,
                                    options={"path": os.path.join(self.dir, "lmdb")}))
        self.config = StoreConfig(tuple(tiers), namespaces_path=os.path.join(self.dir, "ns.json"))
        self.store = Store(self.config)
        self.store.register_namespace(Namespace("m", BLOCK))

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def s(self) -> Store:
        assert self.store is not None
        return self.store

    def dropped(self) -> int:
        """Blocks the store reported dropping, over every incarnation since the start."""
        return self.prior_dropped + int(self.s.stats().totals.dropped)

    @rule(idx=st.lists(key_index, min_size=1, max_size=4, unique=True))
    def put(self, idx: list[int]) -> None:
        hashes = [KEYS[i] for i in idx]
        datas = []
        for i, h in zip(idx, hashes, strict=True):
            if h not in self.model:
                self.version[h] = self.version.get(h, 0) + 1
            datas.append(self.model.get(h, payload(i, self.version[h])))
        result = self.s.put("m", hashes, datas)
        assert result.stored + result.existing + result.refused == len(hashes)
        for h, d in zip(hashes, datas, strict=True):
            self.model.setdefault(h, d)

    @rule(idx=st.lists(key_index, min_size=1, max_size=6))
    def get(self, idx: list[int]) -> None:
        hashes = [KEYS[i] for i in idx]
        got = self.s.get("m", hashes)
        for h, g in zip(hashes, got, strict=True):
            if g is None:
                assert h not in self.model or self.dropped() > 0 or h in self.lost, (
                    "a block was lost although nothing was dropped"
                )
            else:
                assert g == self.model[h], "get returned other bytes than were put"

    @rule(idx=st.lists(key_index, min_size=1, max_size=8))
    def lookup(self, idx: list[int]) -> None:
        hashes = [KEYS[i] for i in idx]
        result = self.s.lookup("m", hashes)
        n = result.prefix_blocks
        assert len(result.tiers) == n
        for h in hashes[:n]:
            assert h in self.model
        if n < len(hashes):
            assert not self.s.contains("m", hashes[n])

    @rule(i=key_index)
    def pin(self, i: int) -> None:
        h = KEYS[i]
        ok = self.s.pin("m", [h], lease_s=600)[0]
        assert ok == self.s.contains("m", h)
        if ok and h not in self.pinned:
            self.pinned[h] = self.s.lookup("m", [h]).tiers[0]

    @rule(i=key_index)
    def release(self, i: int) -> None:
        h = KEYS[i]
        if h in self.pinned:
            assert self.s.release("m", [h]) >= 1
            if not self.s.stats().totals.pinned or h not in self._pinned_now():
                del self.pinned[h]

    def _pinned_now(self) -> set[bytes]:
        return {k[1] for k in self.s._leases.pinned_keys()}

    @rule(i=key_index)
    def delete(self, i: int) -> None:
        h = KEYS[i]
        self.s.delete("m", [h])
        self.model.pop(h, None)
        self.pinned.pop(h, None)
        assert not self.s.contains("m", h)

    @rule()
    def restart(self) -> None:
        self.s.close()  # spills memory-only blocks to disk, which may drop (and count) some
        self.prior_dropped += int(self.s.stats().totals.dropped)
        # only what reached disk survives; with no disk tier everything is gone
        has_disk = len(self.config.tiers) > 1
        self.store = Store(self.config)
        self.pinned.clear()  # pins are process state
        if not has_disk:
            self.lost.update(self.model)

    @invariant()
    def consistent(self) -> None:
        if self.store is None:
            return
        self.s.check_integrity()
        for tier in self.s.tier_names():
            t = self.s.tier(tier)
            assert t.used_bytes() <= t.capacity_bytes
        for h, tier in self.pinned.items():
            entry = self.s._ledger.get(("m", h))
            assert entry is not None, "a pinned block was evicted"
            assert tier in [self.s.tier_names()[p] for p in entry.positions()], (
                "a pinned block left the tier it was pinned in"
            )

    @property
    def lost(self) -> set[bytes]:
        if not hasattr(self, "_lost"):
            self._lost: set[bytes] = set()
        return self._lost


StoreModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreModel = StoreModel.TestCase
