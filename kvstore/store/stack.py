"""The store's stack of tiers, top (fastest) to bottom, with each tier's config and admission
rule, and the facts about the stack that never change after start."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from kvstore.config import TierConfig
from kvstore.errors import KVStoreError
from kvstore.policy import Admission, make_admission
from kvstore.tiers import Tier, make_tier
from kvstore.tiers.base import SharedTier
from kvstore.tiers.slab import SlabShare, SlabTier
from kvstore.types import BlockKey


class TierStack:
    """The tiers, their configs and admission rules, by position (0 = top).

    The tiers own their bytes and the admission rules their own counts; the stack only knows
    which is where. Nothing here changes after construction.
    """

    def __init__(self, configs: Sequence[TierConfig], tiers: Sequence[Tier] | None = None) -> None:
        self.configs: list[TierConfig] = list(configs)
        self.tiers: list[Tier] = list(tiers) if tiers is not None else []
        try:
            if tiers is None:
                for cfg in self.configs:
                    self.tiers.append(make_tier(cfg))
            if len(self.tiers) != len(self.configs):
                raise ValueError("tiers and config.tiers must have the same length")
        except BaseException:
            for tier in self.tiers:
                tier.close()
            raise
        self.admissions: list[Admission] = [make_admission(c.admission) for c in self.configs]
        self.names = [t.name for t in self.tiers]
        # name of the top tier for every tier bitmask (None for no tier)
        self.top_name_by_mask: list[str | None] = [None] + [
            self.names[(m & -m).bit_length() - 1] for m in range(1, 1 << len(self.names))
        ]
        # tiers shared with other nodes (S3): consulted for blocks missing from our index
        self.shared: list[tuple[int, SharedTier]] = [
            (pos, t) for pos, t in enumerate(self.tiers) if isinstance(t, SharedTier)
        ]
        self.host: int | None = self.names.index("host") if "host" in self.names else None
        # the first persistent tier we list at start (not shared): where close() spills
        self.spill_target: int | None = next(
            (p for p, t in enumerate(self.tiers)
             if t.persistent and not isinstance(t, SharedTier)),
            None,
        )

    def __len__(self) -> int:
        return len(self.tiers)

    def pos(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(
                f"unknown tier {name!r}; this store has: {', '.join(self.names)}"
            ) from None

    def slab(self) -> SlabTier:
        """The host tier (always a slab tier); raises if this store has none."""
        if self.host is None:
            raise KVStoreError("this store has no host tier: the shared-memory path is off")
        return cast(SlabTier, self.tiers[self.host])

    def slab_share(self) -> SlabShare | None:
        """The host slab's file descriptor and layout (for ``SCM_RIGHTS``), or None without a
        host tier that can share one."""
        return None if self.host is None else self.slab().share()

    def writes_through(self, pos: int) -> bool:
        """Whether a tier below ``pos`` takes a copy of every new block."""
        return any(c.write_through for c in self.configs[pos + 1:])

    def on_access(self, key: BlockKey) -> None:
        """Tell every admission rule that ``key`` was put or hit."""
        for adm in self.admissions:
            adm.on_access(key)

    def on_access_many(self, keys: Sequence[BlockKey]) -> None:
        """:meth:`on_access` of each key, one call per admission rule."""
        for adm in self.admissions:
            adm.on_access_many(keys)

    def forget(self, key: BlockKey) -> None:
        for adm in self.admissions:
            adm.forget(key)
