"""Each block of a get reply checked as it lands, while its bytes are still in cache.

A reply that sends blocks straight from the server's slab carries each one's recorded checksum
(``sums``). Both socket connections hash a block right after receiving it and hand on a miss
(None, or False for ``get_into``) in place of one that differs; the planner then tells the
server which ones failed (``check``, :mod:`kvstore.client.transfer`). Hashing the block just
received reads it from cache: a check after the whole batch would read it from memory again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from kvstore.checksum import Buffer, checksum


def reply_sums(reply: dict[str, Any], count: int) -> Sequence[int | None] | None:
    """The reply's checksums, one per block, or None where it sends none (or a malformed
    list, which the reply's own validation reports)."""
    sums = reply.get("sums")
    return sums if isinstance(sums, list) and len(sums) == count else None


def landed(sums: Sequence[int | None] | None, i: int, block: Buffer | None) -> bool:
    """Whether block ``i`` arrived as the server recorded it (True where there is nothing to
    check)."""
    if block is None or sums is None or sums[i] is None:
        return block is not None
    return checksum(block) == sums[i]


class Landed(NamedTuple):
    """A block a checked get copied into its buffer. ``checksum``: the checksum the server
    recorded for it, which its bytes matched as they landed; None where the server sent none
    (a block it read from a persistent tier, verified there before sending)."""

    checksum: int | None


def landings(found: Sequence[object], sums: Sequence[int | None] | None) -> list[Landed | None]:
    """``get_into``'s answers (True where a block was copied and passed its check) with the
    checksum each one was checked against; None for a miss."""
    return [Landed(None if sums is None else sums[i]) if ok else None
            for i, ok in enumerate(found)]
