"""Where a chain's stored prefix ends, and which tier tops each of its blocks: entries in RAM
first (a ``dict.get`` per block), then a cold tier's stored run of the rest in one read, then
RAM again, and so on. The ledger's :meth:`~kvstore.store.ledger.Ledger.prefix` asks it, with
its own index and cold index.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.store.cold import ColdIndex
from kvstore.store.index import BlockIndex


def stored_prefix(index: BlockIndex, cold: ColdIndex, by_mask: Sequence[str | None],
                  namespace: str, hashes: Sequence[bytes]) -> list[str]:
    """The top tier's name of each block of the longest stored prefix of ``hashes``: a
    ``dict.get`` per block in RAM, then a cold tier's stored run of the rest in one read.
    An unhashable "hash" ends the prefix (the caller validates the tail)."""
    tiers: list[str] = []
    append = tiers.append
    get = index.namespace(namespace).get
    try:
        for h in hashes:
            entry = get(h)
            if entry is None:
                break
            name = by_mask[entry.tiers]
            if name is None:  # pending shm write: not visible yet
                return tiers
            append(name)
        else:
            return tiers
        if cold.mask:
            _cold_tail(index, cold, by_mask, namespace, hashes, tiers)
    except TypeError:
        pass
    return tiers


def _cold_tail(index: BlockIndex, cold: ColdIndex, by_mask: Sequence[str | None],
               namespace: str, hashes: Sequence[bytes], tiers: list[str]) -> None:
    """Extend ``tiers`` past its first block not in RAM: a cold tier's (disk, S3) stored run
    of the chain, then RAM again, and so on."""
    get = index.namespace(namespace).get
    i, n = len(tiers), len(hashes)
    while i < n:
        entry = get(hashes[i])
        if entry is None:
            run, pos = cold.leading(namespace, hashes[i:])
            if run == 0:
                return
            cold_name = by_mask[1 << pos] or ""  # a one-tier mask always names it
            hots = list(map(get, hashes[i:i + run]))  # a memory tier may hold some too
            if any(hots):  # (an Entry is always true) their top tier is higher
                tiers.extend(cold_name if hot is None else by_mask[hot.tiers] or cold_name
                             for hot in hots)
            else:
                tiers.extend([cold_name] * run)
            i += run
            continue
        name = by_mask[entry.tiers]
        if name is None:
            return
        tiers.append(name)
        i += 1
