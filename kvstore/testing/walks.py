"""The module walk of a store request, traced: which of kvstore's modules a request passes
through, how many times it moves from one to another, and which pairs call each other.

``docs/structure.md`` shows two walks (a put into a full host tier that demotes to disk; a
lookup and get of blocks only the disk holds) and ``tests/docs/test_walks.py`` keeps them free
of cycles. Run ``python -m kvstore.testing.walks`` to print them.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Layout, Namespace
from kvstore.store import Store
from kvstore.types import BlockHash

BLOCK = 4096
HOST_BLOCKS = 16


@dataclass
class Walk:
    """What one traced call did, in kvstore's modules (``kvstore.`` left off)."""

    modules: list[str] = field(default_factory=list)  # in the order first entered
    stops: int = 0  # calls from one module into another
    pairs: set[tuple[str, str]] = field(default_factory=set)  # (caller, callee)
    entered: Counter[str] = field(default_factory=Counter)  # module -> calls into it

    def stops_into(self, prefixes: tuple[str, ...]) -> int:
        """Stops whose callee's name starts with one of ``prefixes``."""
        return sum(n for module, n in self.entered.items() if module.startswith(prefixes))

    @property
    def cycles(self) -> list[tuple[str, str]]:
        """Pairs of modules that called each other: a return to a room already left."""
        return sorted((a, b) for a, b in self.pairs if a < b and (b, a) in self.pairs)


def _module(frame: FrameType | None) -> str | None:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    if not name.startswith("kvstore.") or name.startswith("kvstore.testing"):
        return None
    return name.removeprefix("kvstore.").replace(".", "/")


def trace(call: Callable[[], Any]) -> Walk:
    """Run ``call`` under a profiler that records every call between kvstore's modules."""
    walk = Walk()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = _module(frame)
        if callee is None:
            return
        if callee not in walk.modules:
            walk.modules.append(callee)
        caller = _module(frame.f_back)
        if caller is not None and caller != callee:
            walk.stops += 1
            walk.pairs.add((caller, callee))
            walk.entered[callee] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return walk


def _store(root: Path) -> Store:
    """A host tier of :data:`HOST_BLOCKS` blocks, full, above a disk tier (demotion in the
    writing call, as a put that finds the host tier full does without the demoter)."""
    store = Store(StoreConfig((
        TierConfig("host", HOST_BLOCKS * BLOCK, options={"slot_bytes": BLOCK, "pin": False}),
        TierConfig("disk", 1024 * BLOCK, options={"path": str(root / "disk")}),
    ), spill_on_close=False))
    store.register_namespace(Namespace("w", BLOCK, Layout(model_id="walk", num_layers=1,
                                                           block_size=16, dtype="u8")))
    return store


def _keys(start: int, n: int) -> list[BlockHash]:
    """Hashes as uniform as real block hashes (the what-if trackers sample by hash value:
    about one in a hundred is followed)."""
    return [BlockHash(hashlib.sha256(i.to_bytes(8, "big")).digest())
            for i in range(start, start + n)]


def walks() -> dict[str, Walk]:
    """The two documented walks: ``put`` (8 blocks into the full host tier, 8 demotions) and
    ``lookup+get`` (4 blocks only the disk holds, promoted to the host tier)."""
    block = bytes(range(256)) * (BLOCK // 256)
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp))
        try:
            for start in range(0, 2 * HOST_BLOCKS, 8):  # full, and the first blocks on disk
                store.put("w", _keys(start, 8), [block] * 8)
            store.put("w", _keys(1000, 8), [block] * 8)  # warm every code path once
            store.get("w", _keys(1000, 8))
            put = trace(lambda: store.put("w", _keys(2000, 8), [block] * 8))
            cold = _keys(0, 4)  # the oldest blocks: demoted to disk long ago
            assert store.lookup("w", cold).tiers == ["disk"] * 4, "walk setup: not on disk"

            def lookup_get() -> None:
                store.lookup("w", cold)
                store.get("w", cold)

            read = trace(lookup_get)
        finally:
            store.close()
    return {"put": put, "lookup+get": read}


def main() -> None:
    for name, walk in walks().items():
        print(f"{name}: {len(walk.modules)} modules, {walk.stops} stops, "
              f"cycles: {walk.cycles or 'none'}")
        print("  " + " -> ".join(walk.modules))


if __name__ == "__main__":
    main()
