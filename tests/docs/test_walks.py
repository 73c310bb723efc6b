"""The store's module walks (``docs/structure.md``): a request passes down through the
store's parts and never returns to a module it has left (no two modules call each other)."""

from __future__ import annotations

import pytest

from kvstore.testing.walks import Walk, trace, walks

# the same walks on the mixin store (6701d72), the "before" lines of docs/structure.md
MIXIN_STOPS = {"put": 323, "lookup+get": 218}
# the what-if trackers, which the mixin store did not have: counted apart
WHATIF = ("store/sizing", "whatif/")
WHATIF_STOPS = 16  # a few per tier per batch: one call to feed each tracker, one to sample


@pytest.fixture(scope="module")
def found() -> dict[str, Walk]:
    return walks()


def test_put_and_read_walks_have_no_cycle(found: dict[str, Walk]) -> None:
    assert set(found) == {"put", "lookup+get"}
    for name, walk in found.items():
        assert walk.cycles == [], f"{name}: modules calling each other: {walk.cycles}"
        # the walk reaches the bottom: the request really demoted to / read from the disk
        assert "tiers/disk/tier" in walk.modules and walk.modules[0] == "store/facade", name


def test_walks_stop_less_often_than_the_mixin_store(found: dict[str, Walk]) -> None:
    """The parts talk in batches: a request over N blocks crosses a module boundary a few
    times per batch, not once per block, so the walks stay under the mixin store's stops."""
    for name, walk in found.items():
        whatif = walk.stops_into(WHATIF)
        assert walk.stops - whatif < MIXIN_STOPS[name], f"{name}: {walk.stops} stops"
        assert 0 < whatif <= WHATIF_STOPS, f"{name}: {whatif} stops in the what-if trackers"


def test_a_cycle_is_found() -> None:
    """The tracer itself sees a return to a module already left: a victim predicate that
    asks the ledger again (ledger -> candidates -> ledger)."""
    from kvstore.policy.lru import LRUPolicy
    from kvstore.store.index import Entry
    from kvstore.store.ledger import Ledger

    ledger = Ledger([LRUPolicy()], [None, "host"])
    ledger.add_block(("ns", b"k"), Entry(size=1, checksum=None, layout_id=0), 0)
    walk: Walk = trace(lambda: ledger.victims(0, 1, ledger.__contains__))
    assert ("store/candidates", "store/ledger") in walk.cycles
    assert trace(lambda: ledger.victims(0, 1, bool)).cycles == []
