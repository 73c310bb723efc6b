"""The generation a ``shm_*`` reply hands out is the one the slots had when they were pinned,
reserved or staged (in the same hold of the store lock), never one read afterwards.

Between the store call that pins (or reserves, or stages) and the building of the reply, the
slots can be freed and handed to another block: a pin the client asked for with a tiny lease
runs out, a reservation expires, a client's places are dropped. A generation read then is the
new owner's, and the client's fence passes on that block's slots: a reader copies another
block's bytes as its own, a writer overwrites a block already stored and acknowledged.

Each test runs the server's op handlers (:class:`SharedMemoryOps`) in this process over a
real store, and makes exactly that happen inside the gap: the store call returns, then its
slots go to other blocks before the op builds its reply. The client side is the real
:class:`~kvstore.client.shm.SlabMapping`, mapped from the store's own descriptor.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.client.errors import StaleExtentsError
from kvstore.client.shm import SlabMapping
from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Layout, Namespace
from kvstore.protocol import (
    ExtentsReply,
    ShmAcquire,
    ShmLookup,
    ShmLookupReply,
    ShmReserve,
    ShmStage,
    StageReply,
)
from kvstore.store import Store
from server.auth import ADMIN
from server.dataplane.context import OpsContext, Session
from server.dataplane.shm_ops import READ_SUFFIX, SharedMemoryOps
from server.settings import ServerSettings

BLOCK = 4096
NS = Namespace("g", BLOCK, Layout(model_id="tiny", num_layers=2, block_size=16, dtype="f32"))


def _blocks(n: int) -> tuple[list[bytes], list[bytes]]:
    return [os.urandom(32) for _ in range(n)], [os.urandom(BLOCK) for _ in range(n)]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A host tier of 16 one-slot blocks and nothing below (a client may stage 2 places)."""
    host = TierConfig("host", 16 * BLOCK, options={"slot_bytes": BLOCK})
    made = Store(StoreConfig((host,), namespaces_path=str(tmp_path / "ns.json")))
    made.register_namespace(NS)
    yield made
    made.close()


@pytest.fixture
def slab(store: Store) -> Iterator[SlabMapping]:
    """The host slab as a local client maps it (with the slots' generation words)."""
    share = store.host_share()
    assert share is not None
    mapping = SlabMapping("", share.size, share.slot_bytes, share.gen_offset, fd=share.fd)
    yield mapping
    mapping.close()


def _serve(store: Store, op: str, req: Any, session: Session) -> Any:
    """The reply of ``SharedMemoryOps.<op>`` to ``req``, as the data plane answers it."""

    async def run(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    ops = SharedMemoryOps(OpsContext(store, ServerSettings(), run), enabled=True)
    reply, _ = asyncio.run(getattr(ops, op)(session, req, memoryview(b"")))
    return reply


def _then(store: Store, method: str, gap: Callable[[], None]) -> None:
    """Make the store's ``method`` run ``gap`` right after it returns, before its caller
    (the op) goes on."""
    real = getattr(store, method)

    def call(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        gap()
        return out

    setattr(store, method, call)


def _others_take_the_slots(store: Store, n: int) -> tuple[list[bytes], list[bytes]]:
    """Store ``n`` new blocks (acknowledged): the slab hands them the ``n`` slots freed last,
    those just taken from the client."""
    theirs, their_data = _blocks(n)
    assert store.put(NS.name, theirs, their_data).stored == n
    return theirs, their_data


@pytest.mark.parametrize("op", ["shm_acquire", "shm_lookup"])
def test_a_pin_that_runs_out_before_the_reply_makes_the_copy_a_miss(
        store: Store, slab: SlabMapping, op: str) -> None:
    hashes, data = _blocks(4)
    store.put(NS.name, hashes, data)
    session = Session(ADMIN)
    owner = session.owner + (READ_SUFFIX if op == "shm_acquire" else "#grant")
    taken: list[tuple[list[bytes], list[bytes]]] = []

    def gap() -> None:  # the pin (a tiny lease) runs out; the slots go to other blocks
        assert store.cut_leases(owner, 0) == 4
        store.expire_leases()
        assert store.delete(NS.name, hashes) == 4
        taken.append(_others_take_the_slots(store, 4))

    _then(store, "acquire_read", gap)
    if op == "shm_acquire":
        reply: ExtentsReply | ShmLookupReply = _serve(
            store, op, ShmAcquire(NS.name, hashes, 0.01), session)
    else:
        reply = _serve(store, op, ShmLookup(NS.name, hashes, 0.01), session)
    assert taken and all(ext is not None for ext in reply.extents)
    their_data = set(taken[0][1])
    for ext, gen in zip(reply.extents, reply.gens, strict=True):
        assert ext is not None
        assert slab.read(ext) in their_data  # the slots are another block's now...
        with pytest.raises(StaleExtentsError):  # ...so the fenced copy is a miss
            slab.read(ext, gen)
        with pytest.raises(StaleExtentsError):
            slab.read_into(ext, bytearray(BLOCK), gen)
    store.check_integrity()


@pytest.mark.parametrize("op", ["shm_reserve", "shm_stage"])
def test_write_slots_freed_before_the_reply_are_never_written(
        store: Store, slab: SlabMapping, op: str) -> None:
    """A reservation (or a staged place) freed before the reply is built, its slots then
    given to blocks stored and acknowledged: the late writer's fenced copy must be refused,
    not land on them."""
    session = Session(ADMIN)
    taken: list[tuple[list[bytes], list[bytes]]] = []

    def gap() -> None:  # the client's reservations and places go, other blocks take them
        assert store.expire_leases(session.owner) == 2
        taken.append(_others_take_the_slots(store, 2))

    hashes, _ = _blocks(2)
    if op == "shm_reserve":
        _then(store, "reserve_write", gap)
        reply: ExtentsReply | StageReply = _serve(
            store, op, ShmReserve(NS.name, hashes, 30.0), session)
        places = reply.extents
    else:
        _then(store, "stage_write", gap)
        reply = _serve(store, op, ShmStage(NS.name, 2), session)
        places = list(reply.staged)
    assert taken and len(places) == 2
    evil = b"\xee" * BLOCK
    theirs, their_data = taken[0]
    for ext, gen in zip(places, reply.gens, strict=True):
        assert ext is not None
        assert slab.read(ext) in their_data  # the slots hold stored blocks now
        with pytest.raises(StaleExtentsError):
            slab.write(ext, evil, gen)
    assert store.get(NS.name, theirs) == their_data  # acknowledged blocks untouched
    store.check_integrity()
