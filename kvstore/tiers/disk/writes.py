"""The bodies of the disk tier's write transactions: a batch of blocks stored, a batch of
keys deleted, each with the namespace counts changed in the same transaction.

They are functions of the transaction that :meth:`kvstore.tiers.disk.env.DiskEnv.write` runs
(again, after growing the map, if it was full), so the environment calls into this module
and never back into the tier. When LMDB fails on one key's damaged pages they raise
:class:`~kvstore.tiers.disk.damage.PageDamage` naming it: the tier then remembers the key as
damaged and runs the transaction again without it.
"""

from __future__ import annotations

import lmdb

from kvstore.errors import CapacityError
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.disk.counts import DiskCounts
from kvstore.tiers.disk.damage import DAMAGE_ERRORS, PageDamage, values
from kvstore.tiers.disk.records import HEADER, MAGIC, VERSION, payload_sizes, payloads


def put_all(txn: lmdb.Transaction, blocks: dict[bytes, tuple[memoryview, BlockMeta]],
            counts: DiskCounts, capacity_bytes: int, scratch: memoryview) -> None:
    """Counts first (a key already stored is an overwrite: its old payload no longer
    counts), refused as a whole past ``capacity_bytes``; then header + payload of each block
    through ``scratch`` (at least the largest value long): LMDB copies the value into its own
    pages during ``put``, so the buffer is free again at once, and a warm buffer saves the
    allocation, zeroing and page faults of a fresh value per block (py-lmdb has no
    MDB_RESERVE to write into LMDB's pages directly)."""
    counts.begin()
    olds = payload_sizes(values(txn, blocks))
    counts.note_many(blocks, [old is None for old in olds],
                     [view.nbytes - (old or 0) for (view, _), old in
                      zip(blocks.values(), olds, strict=True)])
    used = counts.used_after()
    if used > capacity_bytes:
        raise CapacityError(f"disk tier: {used} bytes needed of a capacity of {capacity_bytes}")
    for raw, (view, meta) in blocks.items():
        end = HEADER.size + view.nbytes
        HEADER.pack_into(scratch, 0, MAGIC, VERSION, meta.layout_id, meta.checksum, view.nbytes)
        scratch[HEADER.size : end] = view
        try:
            txn.put(raw, scratch[:end])
        except DAMAGE_ERRORS as exc:  # the page the key goes into (or replaces) is damaged
            raise PageDamage(raw, exc) from exc
    counts.stage(txn)


def delete_all(txn: lmdb.Transaction, raws: list[bytes], counts: DiskCounts) -> None:
    """Delete the values of ``raws`` that are ours, and count them gone."""
    counts.begin()
    found = [(raw, old) for raw, old in zip(raws, payload_sizes(values(txn, raws)), strict=True)
             if old is not None]  # else absent, or not ours: nothing counted
    for raw, _ in found:
        try:
            txn.delete(raw)
        except DAMAGE_ERRORS as exc:
            raise PageDamage(raw, exc) from exc
    counts.note_many([raw for raw, _ in found], [-1] * len(found), [-old for _, old in found])
    counts.stage(txn)


def stored(txn: lmdb.Transaction, raws: list[bytes]) -> list[bytes]:
    """Those of ``raws`` whose values are ours."""
    return [raw for raw, old in zip(raws, payload_sizes(values(txn, raws)), strict=True)
            if old is not None]


def read_payloads(txn: lmdb.Transaction, raws: list[bytes]) -> tuple[list[bytes | None],
                                                                    list[int]]:
    """:func:`~kvstore.tiers.disk.records.payloads` of the values of ``raws``."""
    return payloads(values(txn, raws))
