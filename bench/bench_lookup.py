"""How long does the store take to find the cached prefix of a 128k-token prompt?

Target (DESIGN.md section 6): under 1 ms in process. The baseline is the floor any Python
index can reach: a bare ``dict.get`` loop over the same hashes, measured in the same run,
interleaved. Rows report milliseconds; ``ratio`` = floor / store (1.0 = no overhead).

    python bench/bench_lookup.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import os

from common import interleaved, report, row  # bench/ is on sys.path when run as a script

from kvstore.config import StoreConfig, TierConfig
from kvstore.keys import block_hashes
from kvstore.namespace import Namespace
from kvstore.store import Store

TOKENS = 128 * 1024
BLOCK_BYTES = 64  # the lookup never touches bytes; tiny blocks keep the setup fast


def measure(block_size: int, reps: int) -> list[dict]:
    hashes = block_hashes(list(range(TOKENS)), block_size)
    cfg = StoreConfig((TierConfig("host", len(hashes) * 4096, high_watermark=1.0,
                                  low_watermark=1.0, options={"slot_bytes": 4096}),))
    with Store(cfg) as store:
        store.register_namespace(Namespace("bench", BLOCK_BYTES))
        blob = bytes(BLOCK_BYTES)
        for i in range(0, len(hashes), 1024):
            chunk = hashes[i:i + 1024]
            store.put("bench", chunk, [blob] * len(chunk))
        assert store.lookup("bench", hashes).prefix_blocks == len(hashes)
        floor = {h: 1 for h in hashes}

        def bare() -> int:
            n = 0
            get = floor.get
            for h in hashes:
                if get(h) is None:
                    break
                n += 1
            return n

        miss_half = hashes[: len(hashes) // 2] + [os.urandom(32)] + hashes[len(hashes) // 2:]
        full, half, base = interleaved(
            [lambda: store.lookup("bench", hashes), lambda: store.lookup("bench", miss_half),
             bare], reps)
    ms = 1e3
    return [
        row("lookup 128k tokens, full hit", "ms", full * ms, "dict.get loop", base * ms,
            higher_is_better=False, block_size=block_size, blocks=len(hashes),
            under_1ms=full * ms < 1.0),
        row("lookup 128k tokens, miss mid-way", "ms", half * ms, "dict.get loop", base * ms / 2,
            higher_is_better=False, block_size=block_size, blocks=len(hashes),
            under_1ms=half * ms < 1.0),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    args = parser.parse_args(argv)
    reps = 15 if args.quick else 101
    rows = [r for bs in (16, 32) for r in measure(bs, reps)]
    report("lookup", rows, args.json)


if __name__ == "__main__":
    main()
