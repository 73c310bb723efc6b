"""Does the index scale: RAM per block and time to first answer after a restart, at 1M, 4M and
16M blocks held only on disk or only in S3, and lookup latency at each size?

Targets: RAM per disk-only block <= 100 bytes; a restarted store answers
within 1 s whatever the block count. Each size is one LMDB file of tiny blocks (64 bytes: the
index does not care about payload size) written once through the disk tier; then a fresh
process opens a disk-only store on it and is timed from ``Store(...)`` to its first answer (a
lookup of a stored chain and a get of one block), its anonymous RSS measured before and after.
The same probe runs against today's index (the tree before the cold index, exported from git:
every block read into a dict at start) on the smallest size, in the same run: the baseline.

RAM per block is reported twice: right after the restart (the cold index keeps nothing per
block), and with every block touched since (the disk tier's sampled policy then holds a score
per block in its table: its bytes, measured by filling a table with as many keys).

S3-only blocks (``--no-s3`` skips them): a store whose one tier is S3, restarted on a catalog
of ``n`` blocks (the S3 tier's LMDB file), against a real SeaweedFS server started for the run;
its RAM per block is its RSS growth less that of a store on a catalog of only the probe's
blocks (boto3 and its client cost ~25 MB whatever the count).
Only the blocks the probe reads are uploaded; the rest are written into the catalog directly
through its class, since going through S3 for millions of blocks would take hours
(``scale_s3``). The probe's lookup reads the catalog; its get reads a block from the server.

    python bench/bench_scale.py [--quick] [--json PATH] [--plot PATH] [--sizes N,N,...]
        [--s3-sizes N,N,...] [--no-s3] [--no-disk]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import scale_s3
from common import interleaved, report, row  # bench/ is on sys.path when run as a script

from kvstore.types import BlockHash

REPO = Path(__file__).resolve().parents[1]
SIZES = (1_000_000, 4_000_000, 16_000_000)
QUICK_SIZES = (50_000, 200_000, 400_000)
QUICK_S3_SIZES = (50_000, 200_000)
BLOCK = 64
CHUNK = 100_000  # keys generated per seed: a probe regenerates the first chunk only
CHAIN = 64
NS = "scale"


def chunk_keys(seed: int, n: int = CHUNK) -> list[BlockHash]:
    raw = np.random.default_rng(seed).bytes(32 * n)
    return [BlockHash(raw[i:i + 32]) for i in range(0, 32 * n, 32)]


def config(root: str) -> Any:
    from kvstore.config import StoreConfig, TierConfig

    disk = TierConfig("disk", 1 << 40, options={"path": os.path.join(root, "disk"),
                                                "map_size": 1 << 36})
    return StoreConfig((disk,), namespaces_path=os.path.join(root, "namespaces.json"))


def populate(root: str, n: int) -> None:
    """``n`` blocks of namespace :data:`NS` written through the disk tier, batch by batch."""
    from kvstore.checksum import checksum
    from kvstore.namespace import Namespace
    from kvstore.store import Store
    from kvstore.tiers.base import BlockMeta
    from kvstore.tiers.disk import DiskTier

    ns = Namespace(NS, BLOCK)
    with Store(config(root)) as store:
        store.register_namespace(ns)
    payload = os.urandom(BLOCK)
    meta = BlockMeta(ns.layout_id, checksum(payload), BLOCK)
    tier = DiskTier(1 << 40, path=os.path.join(root, "disk"), map_size=1 << 36)
    try:
        for seed in range(-(-n // CHUNK)):
            keys = chunk_keys(seed, min(CHUNK, n - seed * CHUNK))
            tier.put_many([((NS, k), payload, meta) for k in keys])
    finally:
        tier.close()


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def probe(root: str, n: int, reps: int, kind: str) -> dict[str, Any]:
    """Run in a fresh process: restart a store on ``root`` (its disk file, or its S3 catalog)
    and time its first answers."""
    from kvstore.store import Store  # imported before the clock starts, as a server would

    keys = chunk_keys(0, min(CHUNK, n))
    chain = keys[:CHAIN]
    conf = (config(root) if kind == "disk"
            else scale_s3.config(root, json.loads(os.environ[scale_s3.ENV])))
    before = rss_anon()
    start = time.perf_counter()
    store = Store(conf)
    found = store.lookup(NS, chain).prefix_blocks
    got = store.get(NS, [keys[CHAIN]])[0]
    first = time.perf_counter() - start
    after = rss_anon()
    assert found == len(chain) and got is not None and len(got) == BLOCK
    rng = np.random.default_rng(1)
    chains = [[keys[i] for i in rng.integers(0, len(keys), CHAIN)] for _ in range(8)]
    one = keys[CHAIN] if kind == "s3" else chains[0][0]  # S3: a block that is in the bucket
    lookup, get = interleaved(
        [lambda: [store.lookup(NS, c) for c in chains], lambda: store.get(NS, [one])], reps)
    store.close()
    return {"first_answer_s": first, "rss_per_block": (after - before) / n,
            "rss_bytes": after - before,
            "lookup_us": lookup / len(chains) * 1e6, "get_us": get * 1e6}


def score_bytes_per_block(n: int) -> float:
    """The disk policy's table with a score for each of ``n`` blocks, in bytes per block."""
    from kvstore.policy.scores import ScoreTable

    table = ScoreTable()
    for seed in range(-(-n // CHUNK)):
        for i, k in enumerate(chunk_keys(seed, min(CHUNK, n - seed * CHUNK))):
            table.set((NS, k), i + 1)
    return table.nbytes() / n


def run_probe(src: Path, root: str, n: int, reps: int, kind: str = "disk",
              s3: dict[str, Any] | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src), scale_s3.ENV: json.dumps(s3 or {})}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--probe", root, "--n", str(n),
         "--reps", str(reps), "--kind", kind], env=env, cwd=str(src), capture_output=True,
        text=True, check=True, timeout=1800)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def export_baseline(rev: str | None, into: str) -> Path | None:
    """Today's tree (before the cold index) exported from git, or None if git cannot."""
    try:
        if rev is None:
            added = subprocess.run(
                ["git", "log", "--diff-filter=A", "--format=%H", "--", "kvstore/store/cold.py"],
                cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
            if not added:
                return None
            rev = added[-1] + "^"
        tar = subprocess.run(["git", "archive", rev, "kvstore"], cwd=REPO,
                             capture_output=True, check=True).stdout
        os.makedirs(into, exist_ok=True)
        subprocess.run(["tar", "-x", "-C", into], input=tar, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return Path(into)


def measure(sizes: list[int], reps: int, rev: str | None, workdir: str | None) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        base_src = export_baseline(rev, os.path.join(tmp, "baseline"))
        for i, n in enumerate(sizes):
            root = os.path.join(tmp, f"n{n}")
            t0 = time.perf_counter()
            populate(root, n)
            print(f"{n:,} blocks written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            new = run_probe(REPO, root, n, reps)
            old = run_probe(base_src, root, n, reps) if i == 0 and base_src else None
            scores = score_bytes_per_block(n)
            base = "today's index (rebuilt at start)"
            extra = {"blocks": n, "block_bytes": BLOCK}
            rows += [
                row("time to first answer after restart", "s", new["first_answer_s"],
                    base if old else None, old["first_answer_s"] if old else None,
                    higher_is_better=False, under_1s=new["first_answer_s"] < 1.0, **extra),
                row("RAM per disk-only block after restart", "B", new["rss_per_block"],
                    base if old else None, old["rss_per_block"] if old else None,
                    higher_is_better=False, **extra),
                row("RAM per disk-only block, every block touched", "B",
                    max(new["rss_per_block"], 0.0) + scores, base if old else None,
                    old["rss_per_block"] if old else None, higher_is_better=False,
                    under_100B=max(new["rss_per_block"], 0.0) + scores <= 100, **extra),
                row("lookup of a 64-block chain", "us", new["lookup_us"], base if old else None,
                    old["lookup_us"] if old else None, higher_is_better=False, **extra),
                row("get of one block", "us", new["get_us"], base if old else None,
                    old["get_us"] if old else None, higher_is_better=False, **extra),
            ]
            shutil.rmtree(root, ignore_errors=True)
    return rows


def measure_s3(sizes: list[int], reps: int, workdir: str | None) -> list[dict]:
    """The S3-only rows: a store on a catalog of each size, restarted against a real server."""
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp, scale_s3.server(tmp) as server:
        fixed = 0  # RSS a store grows by on a catalog of only the probe's blocks (boto3 &c.)
        for n in [CHAIN + 1, *sizes]:
            root = os.path.join(tmp, f"s3-{n}")
            options = scale_s3.s3_options(root, server)
            t0 = time.perf_counter()
            scale_s3.populate(root, n, options, NS, BLOCK, chunk_keys, CHUNK, CHAIN + 1)
            print(f"{n:,} S3 blocks catalogued in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
            new = run_probe(REPO, root, n, reps, "s3", options)
            shutil.rmtree(root, ignore_errors=True)
            if n == CHAIN + 1:
                fixed = new["rss_bytes"]
                continue
            new["rss_per_block"] = (new["rss_bytes"] - fixed) / n
            touched = max(new["rss_per_block"], 0.0) + score_bytes_per_block(n)
            extra = {"blocks": n, "block_bytes": BLOCK}
            rows += [
                row("time to first answer after restart, S3-only", "s", new["first_answer_s"],
                    higher_is_better=False, under_1s=new["first_answer_s"] < 1.0, **extra),
                row("RAM per S3-only block after restart", "B", new["rss_per_block"],
                    higher_is_better=False, **extra),
                row("RAM per S3-only block, every block touched", "B", touched,
                    higher_is_better=False, under_100B=touched <= 100, **extra),
                row("lookup of a 64-block chain, S3-only", "us", new["lookup_us"],
                    higher_is_better=False, **extra),
                row("get of one block from S3", "us", new["get_us"], higher_is_better=False,
                    **extra),
            ]
    return rows


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = ["time to first answer after restart", "RAM per disk-only block, every block touched",
             "lookup of a 64-block chain"]
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4))
    for ax, case in zip(axes, cases, strict=True):
        mine = [r for r in rows if r["case"] == case]
        ax.plot([r["blocks"] for r in mine], [r["value"] for r in mine], "o-", label="cold index")
        old = [r for r in mine if r["baseline_value"] is not None]
        ax.plot([r["blocks"] for r in old], [r["baseline_value"] for r in old], "s",
                color="red", label="today's index")
        ax.set_xscale("log")
        ax.set_xlabel("blocks on disk")
        ax.set_ylabel(mine[0]["unit"] if mine else "")
        ax.set_title(case, fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of the curves")
    parser.add_argument("--sizes", help="comma-separated block counts (default 1M,4M,16M)")
    parser.add_argument("--baseline-rev", help="git revision of today's index (default: the "
                        "parent of the commit that added the cold index)")
    parser.add_argument("--workdir", help="where the LMDB files go (default: the temp dir)")
    parser.add_argument("--s3-sizes", help="comma-separated block counts of the S3-only rows "
                        "(default: as --sizes; quick: 50K,200K)")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3-only rows")
    parser.add_argument("--no-disk", action="store_true", help="skip the disk-only rows")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="disk", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=21, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe, args.n, args.reps, args.kind)))
        return
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else list(QUICK_SIZES if args.quick else SIZES))
    s3_sizes = ([int(s) for s in args.s3_sizes.split(",")] if args.s3_sizes
                else list(QUICK_S3_SIZES if args.quick else sizes))
    reps = 7 if args.quick else 21
    rows = [] if args.no_disk else measure(sizes, reps, args.baseline_rev, args.workdir)
    if not args.no_s3:
        rows += measure_s3(s3_sizes, reps, args.workdir)
    report("scale", rows, args.json)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
