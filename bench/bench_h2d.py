"""How fast do stored blocks reach the GPU's KV pages from the host slab: one copy per page or
batched, with the slab page-locked in the engine's process or not?

An engine that loads a prefix from kvstore copies each block from the server's host slab
(shared memory, mapped into the engine's process) into the page of every layer of its paged
KV cache. The server pins the slab with ``cudaHostRegister`` in its own process; a mapping in
another process is pageable unless that process registers it too. Cases (``n`` blocks of
``layers`` pages each, at the extents a real ``HostTier`` hands out), each a ratio against
``pinned copy``, one copy of the same bytes from a pinned buffer to the GPU (the DMA ceiling),
all interleaved in one run:

- ``per page, pageable``: one ``copy_`` per layer page straight from the slab as mapped;
- ``per page, registered``: the same from a slab registered in this process, non-blocking,
  one synchronize at the end;
- ``staged, pageable buf``: the vLLM connector's load today (``PagedKV.scatter_extents``):
  the extents gathered on the CPU into a reused pageable buffer, one copy of the batch to the
  GPU, one ``index_copy_`` per layer;
- ``staged, pinned buf``: the same through a pinned buffer;
- ``batched, registered``: from the registered slab straight into one GPU staging tensor (a
  copy per extent, non-blocking), then one ``index_copy_`` per layer: no CPU copy at all;
- ``engine scatter_blocks``: the built-in engine's ``kernels.scatter_blocks`` from slab
  views (a pinned staging buffer per call, one copy, one ``index_copy_``).

Each case is checked once (pages zeroed, copied, compared with the blocks) before it is timed.
Without CUDA it measures nothing and reports ``"skipped": "no CUDA"``; ``--device cpu`` runs
the same cases with CPU copies (the registered and pinned ones need CUDA and are left out),
which is how the tests exercise it.

    python bench/bench_h2d.py [--quick] [--json PATH] [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import interleaved, machine, report, row

from connectors.vllm.pages import PagedKV
from engines.decoder import kernels
from kvstore.config import DEFAULT_SLOT_BYTES
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.host import HostTier

KiB, MiB = 1 << 10, 1 << 20
Extents = Sequence[Sequence[int]]


class Layout(NamedTuple):
    layers: int
    page_bytes: int
    blocks: int  # per load

    @property
    def block_bytes(self) -> int:
        return self.layers * self.page_bytes


QUICK = (Layout(16, 16 * KiB, 64), Layout(32, 64 * KiB, 16))  # 256 KiB and 2 MiB blocks
FULL = (Layout(16, 16 * KiB, 128), Layout(32, 16 * KiB, 64), Layout(32, 64 * KiB, 32))


class Slab(NamedTuple):
    tier: HostTier
    array: np.ndarray  # the slab as uint8, sharing its memory
    tensor: torch.Tensor  # the same memory as a CPU tensor
    extents: list[Extents]  # of each block, in load order

    @property
    def registered(self) -> bool:
        return self.tier.pinned is not None


def fill_slab(blocks: list[bytes], register: bool) -> Slab:
    """A host tier holding ``blocks``; with ``register`` (and CUDA) page-locked in this
    process, as the server does to its own."""
    size = len(blocks[0])
    per_block = -(-size // DEFAULT_SLOT_BYTES) * DEFAULT_SLOT_BYTES  # whole slots
    tier = HostTier((len(blocks) + 1) * per_block, pin=register)
    keys = [("h2d", i.to_bytes(8, "big")) for i in range(len(blocks))]
    tier.put_many([(k, b, BlockMeta(0, 0, size)) for k, b in zip(keys, blocks, strict=True)])
    array = np.frombuffer(tier.view(0, tier.slab_bytes), np.uint8)
    return Slab(tier, array, torch.from_numpy(array), [tier.extents(k) for k in keys])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_page(kv: list[torch.Tensor], ids: list[int], slab: Slab, page: int,
             non_blocking: bool) -> Callable[[], None]:
    """One ``copy_`` per layer page (a page cut by an extent boundary takes two)."""
    def run() -> None:
        for j, ext in enumerate(slab.extents):
            pos = 0  # byte of the block: layer pos // page, at pos % page in its page
            for off, length in ext:
                while length:
                    layer, at = divmod(pos, page)
                    take = min(length, page - at)
                    kv[layer][ids[j], at : at + take].copy_(
                        slab.tensor[off : off + take], non_blocking=non_blocking)
                    pos, off, length = pos + take, off + take, length - take
        sync(kv[0].device)
    return run


def staged(pages: PagedKV, ids: list[int], slab: Slab, buf: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        pages.scatter_extents(ids, slab.array, slab.extents, buf)
        sync(pages.device)
    return run


def batched(pages: PagedKV, ids: list[int], slab: Slab) -> Callable[[], None]:
    """Extents straight into one staging tensor on the device, then a scatter there."""
    stage = torch.empty((len(ids), pages.block_bytes), dtype=torch.uint8, device=pages.device)

    def run() -> None:
        for j, ext in enumerate(slab.extents):
            pos = 0
            for off, length in ext:
                stage[j, pos : pos + length].copy_(slab.tensor[off : off + length],
                                                   non_blocking=True)
                pos += length
        pages.scatter(ids, stage)
        sync(pages.device)
    return run


def engine_scatter(cache: torch.Tensor, ids: list[int], slab: Slab) -> Callable[[], None] | None:
    """``kernels.scatter_blocks`` from views of the slab; None when a block is not one run
    (the engine gets whole blocks from the store)."""
    if any(len(ext) != 1 for ext in slab.extents):
        return None
    views = [slab.array[off : off + n].data for ((off, n),) in slab.extents]

    def run() -> None:
        kernels.scatter_blocks(cache, ids, views)
        sync(cache.device)
    return run


def bench_layout(lay: Layout, device: torch.device, reps: int) -> list[dict[str, Any]]:
    n, bb, pb = lay.blocks, lay.block_bytes, lay.page_bytes
    raw = np.random.default_rng(bb).integers(0, 256, n * bb, dtype=np.uint8)
    blocks = [raw[i * bb : (i + 1) * bb].tobytes() for i in range(n)]
    want = torch.from_numpy(raw.reshape(n, bb))
    cuda = device.type == "cuda"
    num_blocks = 2 * n + 1
    ids = [int(i) for i in np.random.default_rng(n).permutation(num_blocks)[:n]]
    kv = [torch.empty((num_blocks, pb), dtype=torch.uint8, device=device)
          for _ in range(lay.layers)]
    pages = PagedKV({f"layer{i}": t for i, t in enumerate(kv)}, num_blocks)
    cache = torch.empty((num_blocks, bb), dtype=torch.uint8, device=device)
    plain = fill_slab(blocks, register=False)
    pinned = fill_slab(blocks, register=True) if cuda else None

    host = torch.empty(n * bb, dtype=torch.uint8, pin_memory=cuda)
    host.copy_(want.reshape(-1))
    dst = torch.empty(n * bb, dtype=torch.uint8, device=device)

    def baseline() -> None:
        dst.copy_(host, non_blocking=True)
        sync(device)

    cases: dict[str, Callable[[], None] | None] = {
        "per page, pageable": per_page(kv, ids, plain, pb, non_blocking=False),
        "staged, pageable buf": staged(pages, ids, plain,
                                       torch.zeros((n, bb), dtype=torch.uint8)),
    }
    if pinned is not None and pinned.registered:
        cases["per page, registered"] = per_page(kv, ids, pinned, pb, non_blocking=True)
        cases["batched, registered"] = batched(pages, ids, pinned)
    if cuda:
        cases["staged, pinned buf"] = staged(
            pages, ids, plain, torch.empty((n, bb), dtype=torch.uint8, pin_memory=True))
    else:
        cases["batched"] = batched(pages, ids, plain)
    cases["engine scatter_blocks"] = engine_scatter(cache, ids, plain)
    runs = {name: fn for name, fn in cases.items() if fn is not None}
    for name, fn in runs.items():  # each case once, checked, before any timing
        for t in (*kv, cache):
            t.zero_()
        fn()
        got = cache[ids].cpu() if name == "engine scatter_blocks" else pages.gather(ids)
        if not torch.equal(got, want):
            raise AssertionError(f"{name}: the pages do not hold the blocks")
    times = interleaved([baseline, *runs.values()], reps, warmup=1)
    base_name = "pinned copy" if cuda else "plain copy"
    nbytes = n * bb
    out = [row(name, "GB/s", nbytes / t / 1e9, base_name, nbytes / times[0] / 1e9,
               higher_is_better=True, block_bytes=bb, layers=lay.layers, page_bytes=pb,
               blocks=n)
           for name, t in zip(runs, times[1:], strict=True)]
    registered = pinned is not None and pinned.registered
    for r in out:
        r["slab_registered"] = registered
    for s in (plain, pinned):
        if s is not None:
            s.tier.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="well under a minute, every row")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--device", default=None,
                    help="cuda (the default when present) or cpu (to test the cases)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # copies, not compute: one thread keeps a shared machine steady
    cuda = torch.cuda.is_available()
    device = args.device or ("cuda" if cuda else None)
    if device is not None and device.startswith("cuda") and not cuda:
        ap.error("--device cuda but torch sees no CUDA device")
    doc: dict[str, Any] = {
        "bench": "h2d",
        "machine": machine(device=device, cuda_device=torch.cuda.get_device_name(0)
                           if cuda else None, pid=os.getpid()),
        "rows": [],
        "skipped": None,
    }
    if device is None:
        doc["skipped"] = "no CUDA"
        print("no CUDA: nothing to measure (--device cpu runs the cases on the CPU)")
    else:
        for lay in QUICK if args.quick else FULL:
            doc["rows"] += bench_layout(lay, torch.device(device), 9 if args.quick else 31)
        report("h2d", doc["rows"], None)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
