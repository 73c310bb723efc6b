"""How fast do puts go into a full host tier that demotes to disk, against raw LMDB writes of
the same bytes?

A store with a host tier (shared memory) over a disk tier (LMDB) is filled until the host
tier sits at its watermark; from then on every batch of new blocks makes the store demote as
many victims to disk. ``demote put`` times one ``Store.put`` of a batch of fresh blocks (copy
into the slab, read the victims back, checksum them, write them to LMDB, update the index);
its baseline ``raw lmdb`` writes the same number of values of the same size (header
included) in one py-lmdb transaction with the disk tier's environment flags, which is the
least the disk must do for those bytes. Batched demotion makes that one transaction per batch
in the store too; demoting one block per transaction costs a commit (an fsync) per block.

    python bench/bench_demote.py [--quick] [--json PATH] [--dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
from pathlib import Path

import lmdb
from common import interleaved, machine, report, row  # bench/ is on sys.path as a script
from tqdm import tqdm

from kvstore.checksum import checksum
from kvstore.config import StoreConfig, TierConfig
from kvstore.namespace import Layout, Namespace
from kvstore.store import Store
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.disk.records import encode_key, pack_value

KiB, MiB = 1 << 10, 1 << 20
SIZES = (64 * KiB, 256 * KiB, 1 * MiB)
BATCH_BYTES = 8 * MiB  # bytes per put: 32 blocks of 256 KiB
HOST_BATCHES = 4  # the host tier holds this many batches


def bench_size(root: Path, size: int, reps: int) -> dict[str, object]:
    batch = max(4, BATCH_BYTES // size)
    host_bytes = HOST_BATCHES * batch * size
    disk_bytes = (reps + 8) * batch * size * 2
    ns = Namespace("bench", size, Layout(model_id="bench", num_layers=1, block_size=16,
                                          dtype="u8"))
    store = Store(StoreConfig((
        TierConfig("host", host_bytes, options={"slot_bytes": size, "pin": False}),
        TierConfig("disk", disk_bytes, options={"path": str(root / f"store-{size}")}),
    ), spill_on_close=False))
    env = lmdb.open(str(root / f"raw-{size}"), map_size=store.tier("disk").map_size(),  # type: ignore[attr-defined]
                    subdir=True, readahead=True, sync=True, metasync=True, writemap=False)
    try:
        store.register_namespace(ns)
        block = os.urandom(size)
        seq = itertools.count()

        def fresh(n: int) -> list[bytes]:
            return [next(seq).to_bytes(16, "big") for _ in range(n)]

        # fill the host tier past its high watermark: from here on every put demotes
        for _ in range(HOST_BATCHES + 1):
            store.put("bench", fresh(batch), [block] * batch)
        value = bytes(pack_value(block, BlockMeta(ns.layout_id, checksum(block), size)))

        def demote_put() -> None:
            store.put("bench", fresh(batch), [block] * batch)

        def raw_put() -> None:
            with env.begin(write=True) as txn:
                for h in fresh(batch):
                    txn.put(encode_key(("bench", h)), value)

        before = store.stats().tiers["host"].demotions
        t_store, t_raw = interleaved([demote_put, raw_put], reps)
        demoted = store.stats().tiers["host"].demotions - before
        store.check_integrity()
    finally:
        env.close()
        store.close()
    nbytes = batch * size
    return row("demote put", "GB/s", nbytes / t_store / 1e9, "raw lmdb", nbytes / t_raw / 1e9,
               higher_is_better=True, block_bytes=size, batch=batch,
               demoted_per_put=round(demoted / (reps + 2), 1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="well under a minute, every row")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--dir", help="where the LMDB files go (default: a temporary directory)")
    args = ap.parse_args(argv)
    reps = 5 if args.quick else 15
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = [bench_size(Path(tmp), size, reps)
                for size in tqdm(SIZES, desc="demote", leave=False, file=sys.stderr)]
    report("demote", rows, args.json)
    print(f"machine: {machine('lmdb')}")


if __name__ == "__main__":
    main()
