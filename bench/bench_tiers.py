"""How fast are the device, host and disk tiers against a plain copy of the same bytes?

Each measured case runs interleaved (A B A B ...) with its baseline in the same process, after a
warm-up, and reports the median of the repetitions:

- ``host put``/``host get``: ``put_many``/``get_many`` of a batch vs a numpy memcpy of the same
  blocks into a preallocated, page-aligned buffer; ``host shm put``/``host shm get``: the
  zero-copy client path (``reserve_many``, copy into the slab at the extents,
  ``publish_many``; ``extents``, copy out into the client's buffer) vs the same memcpy.
  Target: 0.70 of memcpy (DESIGN.md section 6). ``get_many`` must return fresh ``bytes``
  (the tier contract), so its row also pays the allocation the memcpy baseline does not.
- ``device put``/``device get``: the same on a CPU tensor slab (no target). With ``--device
  cuda`` the slab is in GPU memory and the baseline is one copy of the same bytes between a
  pinned host buffer and the GPU (the DMA ceiling; memcpy would be the wrong one), no target.
- ``disk put``/``disk get``: ``put_many``/``get_many`` vs raw py-lmdb puts/gets of the same
  values (header included), same batch, same environment flags (sync, metasync, readahead).
  Target: 0.80 of raw LMDB.

Latency rows give p50/p99 of single-block calls against single-block baselines (p99 on a
shared machine mostly measures the neighbours).

Memory cases use batches of at most 2 MiB so that a repetition is well under a scheduler slice;
torch runs with one intra-op thread (see ``main``). ``machine.loadavg_1min`` records the load
before and after the run: above the number of CPUs, read the ratios as rough.

    python bench/bench_tiers.py [--quick] [--json PATH] [--plot PATH] [--dir DIR]
        [--device cpu|cuda] [--only host,device,disk]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import lmdb
import numpy as np
import torch
from common import machine  # bench/ is on sys.path when run as a script
from tqdm import tqdm

from kvstore.checksum import checksum
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.device import DeviceTier
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.disk.records import encode_key, pack_value
from kvstore.tiers.host import HostTier
from kvstore.tiers.slab import SlabTier

KiB, MiB = 1 << 10, 1 << 20
SIZES = (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
TARGETS = {"host": 0.70, "disk": 0.80}


class Plan(NamedTuple):
    reps: int  # interleaved repetitions of each case and its baseline
    lat_n: int  # single-block calls for the latency percentiles
    batch_bytes: int  # bytes per batched call: 32 blocks, fewer when they are big

    def batch(self, size: int) -> int:
        return max(1, min(32, self.batch_bytes // size))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleave(
    a: Callable[[], object],
    b: Callable[[], object],
    reps: int,
    reset_a: Callable[[], object] = lambda: None,
) -> tuple[list, list]:
    """Times of ``a`` and of ``b``, alternated after one warm-up of each; ``reset_a`` runs
    untimed before each ``a``."""
    reset_a(), a(), b()
    ta, tb = [], []
    for _ in range(reps):
        reset_a()
        ta.append(timed(a))
        tb.append(timed(b))
    return ta, tb


def make_blocks(size: int, n: int) -> list[bytes]:
    raw = np.random.default_rng(size).integers(0, 256, size * n, dtype=np.uint8).tobytes()
    view = memoryview(raw)
    return [bytes(view[i * size : (i + 1) * size]) for i in range(n)]


def row(
    case: str,
    size: int,
    unit: str,
    value: float,
    base: str | None,
    base_value: float | None,
    target: float | None,
) -> dict[str, Any]:
    ratio = None
    if base_value:
        ratio = value / base_value if unit == "GB/s" else base_value / value
    return {
        "case": case,
        "block_bytes": size,
        "unit": unit,
        "value": round(value, 3),
        "baseline": base,
        "baseline_value": None if base_value is None else round(base_value, 3),
        "ratio": None if ratio is None else round(ratio, 3),
        "target": target,
        "meets_target": None if target is None or ratio is None else ratio >= target,
    }


def throughput_rows(
    case: str, size: int, nbytes: int, ta: list, tb: list, base: str, target: float | None
) -> dict[str, Any]:
    value, base_value = (nbytes / statistics.median(t) / 1e9 for t in (ta, tb))
    return row(case, size, "GB/s", value, base, base_value, target)


def latency_rows(case: str, size: int, ta: list, tb: list, base: str) -> list[dict[str, Any]]:
    out = []
    for q, label in ((50, "p50"), (99, "p99")):
        a, b = (float(np.percentile(np.array(t) * 1e6, q)) for t in (ta, tb))
        out.append(row(f"{case} {label}", size, "us", a, base, b, None))
    return out


def page_aligned(n: int) -> np.ndarray:
    """A buffer laid out like a slab slot: page-aligned, on 4 KiB pages. memcpy speed at
    64 KiB-4 MiB depends on where source and destination sit within a page (glibc picks
    ``rep movsb``, which on some CPUs slows down several times at unlucky relative offsets)
    and on the page size (numpy asks for transparent huge pages for big arrays; a shared
    memory slab rarely gets them), so the baseline copies between buffers like the tier's and
    the ratio measures the tier, not the memory under it."""
    buf = mmap.mmap(-1, n)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, np.uint8)


def copier(dst: np.ndarray, srcs: list[np.ndarray]) -> Callable[[], None]:
    """memcpy of each source block into its place in ``dst``: the baseline of every copy."""
    size = len(srcs[0])

    def run() -> None:
        for i, src in enumerate(srcs):
            np.copyto(dst[i * size : (i + 1) * size], src)

    return run


def bench_slab(kind: str, tier: SlabTier, size: int, batch: int, reps: int, lat_n: int) -> list:
    blocks = make_blocks(size, batch)
    keys = [(kind, i.to_bytes(8, "big")) for i in range(batch)]
    items = [(k, b, BlockMeta(0, 0, size)) for k, b in zip(keys, blocks, strict=True)]
    srcs = [np.frombuffer(b, np.uint8) for b in blocks]
    dst, out = page_aligned(batch * size), page_aligned(batch * size)
    memcpy_in = copier(dst, srcs)
    memcpy_out = copier(out, [dst[i * size : (i + 1) * size] for i in range(batch)])
    target = TARGETS.get(kind)
    nbytes = batch * size
    put, get = (lambda: tier.put_many(items)), (lambda: tier.get_many(keys))
    rows = [
        throughput_rows(
            f"{kind} put", size, nbytes, *interleave(put, memcpy_in, reps), "memcpy", target
        ),
        throughput_rows(
            f"{kind} get", size, nbytes, *interleave(get, memcpy_out, reps), "memcpy", target
        ),
    ]
    if isinstance(tier, HostTier):
        rows += bench_shm(tier, keys, srcs, out, memcpy_in, memcpy_out, reps)
    one, one_dst = items[:1], dst[:size]
    rows += latency_rows(
        f"{kind} put latency",
        size,
        *interleave(lambda: tier.put_many(one), copier(one_dst, srcs[:1]), lat_n),
        "memcpy",
    )
    rows += latency_rows(
        f"{kind} get latency",
        size,
        *interleave(lambda: tier.get_many(keys[:1]), copier(out[:size], [one_dst]), lat_n),
        "memcpy",
    )
    tier.close()
    return rows


def bench_cuda(tier: DeviceTier, size: int, batch: int, reps: int, lat_n: int) -> list:
    """The device tier on a GPU: ``put_many`` of ``bytes`` and ``get_many`` into ``bytes`` vs
    one copy of the same bytes between a pinned host buffer and the GPU."""
    blocks = make_blocks(size, batch)
    keys = [("device", i.to_bytes(8, "big")) for i in range(batch)]
    items = [(k, b, BlockMeta(0, 0, size)) for k, b in zip(keys, blocks, strict=True)]
    nbytes = batch * size
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=tier.device)
    sync = torch.cuda.synchronize

    def put(part: list = items) -> None:
        tier.put_many(part)
        sync()  # a pageable copy may return before the GPU has the bytes

    def copy_in(n: int = nbytes) -> None:
        dev[:n].copy_(host[:n], non_blocking=True)
        sync()

    def copy_out(n: int = nbytes) -> None:
        host[:n].copy_(dev[:n], non_blocking=True)
        sync()

    base = "pinned copy"
    rows = [
        throughput_rows("device put", size, nbytes, *interleave(put, copy_in, reps), base, None),
        throughput_rows("device get", size, nbytes,
                        *interleave(lambda: tier.get_many(keys), copy_out, reps), base, None),
    ]
    rows += latency_rows("device put latency", size,
                         *interleave(lambda: put(items[:1]), lambda: copy_in(size), lat_n), base)
    rows += latency_rows("device get latency", size,
                         *interleave(lambda: tier.get_many(keys[:1]), lambda: copy_out(size),
                                     lat_n), base)
    tier.close()
    return rows


def bench_shm(
    tier: HostTier,
    keys: list,
    srcs: list,
    out: np.ndarray,
    memcpy_in: Callable,
    memcpy_out: Callable,
    reps: int,
) -> list:
    """The zero-copy client path, with the slab mapped as a numpy array as a client maps it."""
    slab = np.frombuffer(tier.view(0, tier.slab_bytes), np.uint8)
    size = len(srcs[0])
    shm_keys = [("shm", k[1]) for k in keys]

    # The store reserves slots only for blocks it does not hold, so each repetition writes
    # new keys into free slots (the ones the untimed delete before it just freed, as warm as
    # the memcpy's destination) rather than replacing stored copies.
    def clear() -> None:
        tier.delete(shm_keys)

    def put() -> None:  # the store's reserve_write / commit_write: one batch each way
        reserved = tier.reserve_many([(k, size) for k in shm_keys])
        for extents, src in zip(reserved, srcs, strict=True):
            if len(extents) == 1:  # what a client does first: one run, one copy
                off, n = extents[0]
                np.copyto(slab[off : off + n], src)
                continue
            pos = 0
            for off, n in extents:
                np.copyto(slab[off : off + n], src[pos : pos + n])
                pos += n
        tier.publish_many(shm_keys)

    def get() -> None:
        for i, k in enumerate(shm_keys):
            pos = i * size
            for off, n in tier.extents(k):
                np.copyto(out[pos : pos + n], slab[off : off + n])
                pos += n

    nbytes = len(srcs) * size
    return [
        throughput_rows(
            "host shm put",
            size,
            nbytes,
            *interleave(put, memcpy_in, reps, reset_a=clear),
            "memcpy",
            TARGETS["host"],
        ),
        throughput_rows(
            "host shm get",
            size,
            nbytes,
            *interleave(get, memcpy_out, reps),
            "memcpy",
            TARGETS["host"],
        ),
    ]


def bench_disk(root: str, size: int, batch: int, reps: int, lat_n: int) -> list:
    blocks = make_blocks(size, batch)
    keys = [("disk", i.to_bytes(8, "big")) for i in range(batch)]
    metas = [BlockMeta(1, checksum(b), size) for b in blocks]
    items = list(zip(keys, blocks, metas, strict=True))
    tier = DiskTier(2 * batch * size, path=os.path.join(root, f"tier-{size}"))
    env = lmdb.open(
        os.path.join(root, f"raw-{size}"),
        map_size=tier.map_size(),
        subdir=True,
        readahead=True,
        sync=True,
        metasync=True,
        writemap=False,
        max_dbs=0,
    )
    raw = [(encode_key(k), bytes(pack_value(b, m))) for k, b, m in items]

    def raw_put(pairs: list = raw) -> None:
        with env.begin(write=True) as txn:
            for k, v in pairs:
                txn.put(k, v)

    def raw_get(pairs: list = raw) -> list:
        # Keeps every value until the batch is done, as get_many's caller does: freeing each
        # one at once would let malloc hand the same warm pages back (no page faults).
        with env.begin() as txn:
            return [txn.get(k) for k, _ in pairs]

    nbytes = batch * size
    rows = [
        throughput_rows(
            "disk put",
            size,
            nbytes,
            *interleave(lambda: tier.put_many(items), raw_put, reps),
            "raw lmdb",
            TARGETS["disk"],
        ),
        throughput_rows(
            "disk get",
            size,
            nbytes,
            *interleave(lambda: tier.get_many(keys), raw_get, reps),
            "raw lmdb",
            TARGETS["disk"],
        ),
    ]
    rows += latency_rows(
        "disk put latency",
        size,
        *interleave(lambda: tier.put_many(items[:1]), lambda: raw_put(raw[:1]), lat_n),
        "raw lmdb",
    )
    rows += latency_rows(
        "disk get latency",
        size,
        *interleave(lambda: tier.get_many(keys[:1]), lambda: raw_get(raw[:1]), lat_n),
        "raw lmdb",
    )
    tier.close()
    env.close()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'case':<24}{'block':>8}{'value':>10} {'unit':<5}{'baseline':>10}{'base':>10}"
    print(head + f"{'ratio':>8}{'target':>8}  ok")
    for r in rows:
        kib = f"{r['block_bytes'] // KiB}K"
        fmt = lambda v, w: f"{'-':>{w}}" if v is None else f"{v:>{w}.3f}"  # noqa: E731
        ok = {True: "yes", False: "NO", None: ""}[r["meets_target"]]
        print(
            f"{r['case']:<24}{kib:>8}{fmt(r['value'], 10)} {r['unit']:<5}"
            f"{r['baseline'] or '-':>10}{fmt(r['baseline_value'], 10)}{fmt(r['ratio'], 8)}"
            f"{fmt(r['target'], 8)}  {ok}"
        )


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = [r for r in rows if r["unit"] == "GB/s"]
    cases = sorted({r["case"] for r in tp}, key=[r["case"] for r in tp].index)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(SIZES)
    for j, size in enumerate(SIZES):
        ratios = [
            next((r["ratio"] for r in tp if r["case"] == c and r["block_bytes"] == size), 0)
            for c in cases
        ]
        ax.bar(np.arange(len(cases)) + j * width, ratios, width, label=f"{size // KiB} KiB")
    for t in set(TARGETS.values()):
        ax.axhline(t, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks(np.arange(len(cases)) + 0.4 - width / 2, cases, rotation=20)
    ax.set_ylim(0, min(2.0, max((r["ratio"] or 0) for r in tp) * 1.1))  # noise spikes clip
    ax.set_ylabel("ratio to baseline (higher is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="well under a minute, every row")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--plot", metavar="PATH")
    ap.add_argument("--dir", help="where the LMDB files go (default: a temporary directory)")
    ap.add_argument("--device", default="cpu", help="torch device of the device tier's slab")
    ap.add_argument("--only", default="host,device,disk", help="comma-separated tiers to run")
    args = ap.parse_args(argv)
    kinds = [k for k in ("host", "device", "disk") if k in args.only.split(",")]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no CUDA device")
    # Tiers copy, they do not compute: torch's intra-op pool only adds wake-ups to a CPU copy_
    # of a few hundred KiB, and on a busy machine a copy_ waiting for its second thread took
    # 30x longer than the copy. (On CUDA the copy is a cudaMemcpy and this does not matter.)
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    # Memory copies: short repetitions (a batch of at most 2 MiB: 32 blocks of 64 KiB, one of
    # 4 MiB), many of them. On a shared machine a repetition of several ms is preempted more
    # often than not and medians then measure the neighbours; sub-ms ones mostly are not.
    # Disk: each put is an fsync'd commit that dominates the time; fewer, larger batches.
    mem = Plan(reps=51, lat_n=100, batch_bytes=2 * MiB)
    disk = Plan(reps=9, lat_n=20, batch_bytes=8 * MiB)
    if not args.quick:
        mem = Plan(reps=201, lat_n=400, batch_bytes=2 * MiB)
        disk = Plan(reps=25, lat_n=60, batch_bytes=8 * MiB)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        jobs = [(kind, size) for size in SIZES for kind in kinds]
        for kind, size in tqdm(jobs, desc="tiers", leave=False):
            if kind == "disk":
                rows += bench_disk(root, size, disk.batch(size), disk.reps, disk.lat_n)
                continue
            batch = mem.batch(size)
            # a batch, its shm copy, the shm copy that replaces it, and a latency block
            cap = 3 * batch * size + size
            if kind == "device" and args.device != "cpu":
                rows += bench_cuda(DeviceTier(cap, device=args.device), size, batch, mem.reps,
                                   mem.lat_n)
                continue
            tier: SlabTier = (
                HostTier(cap, pin=False) if kind == "host" else DeviceTier(cap, device="cpu")
            )
            rows += bench_slab(kind, tier, size, batch, mem.reps, mem.lat_n)
    rows.sort(
        key=lambda r: (r["case"].split()[0], "latency" in r["case"], r["case"], r["block_bytes"])
    )
    print_table(rows)
    result = {
        "bench": "tiers",
        "machine": machine(
            "lmdb",
            torch_threads=torch.get_num_threads(),
            device=args.device,
            cuda_device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            loadavg_1min=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        ),
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
