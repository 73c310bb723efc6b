"""Which blocks of a demotion go into one object: runs of consecutive blocks, in the order
the store hands them over.

The store hands a tier the blocks of one put in the caller's order, and every caller puts a
chain's blocks in chain order (the vLLM connector saves a request's new full blocks in order;
demotion batches keep the policy's order, which for a chain put together is chain order), so
consecutive blocks of a batch are, as a rule, consecutive blocks of a chain: one ranged GET
then reads a run of a prompt's prefix. Nothing depends on it for correctness: every block has
its own key (its group object or a pointer, see ``layout``), so a group of unrelated blocks
only reads slower.

A group holds blocks of one namespace and one size, at most ``max_blocks`` of them and at most
``max_bytes`` in all (a block larger than that goes alone).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.types import BlockKey

Item = tuple[BlockKey, Buffer, BlockMeta]


def cut(items: Sequence[Item], max_blocks: int, max_bytes: int) -> list[list[Item]]:
    """``items`` cut into groups of consecutive items, in order."""
    groups: list[list[Item]] = []
    run: list[Item] = []
    run_bytes = 0
    for it in items:
        key, _, meta = it
        if run and (
            len(run) >= max_blocks
            or key[0] != run[0][0][0]
            or meta.size != run[0][2].size
            or run_bytes + meta.size > max_bytes
        ):
            groups.append(run)
            run, run_bytes = [], 0
        run.append(it)
        run_bytes += meta.size
    if run:
        groups.append(run)
    return groups
