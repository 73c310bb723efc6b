"""What :func:`~kvstore.explain.explain` reports: one :class:`BlockReport` per full block of
the prompt and an :class:`Explanation` over them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from kvstore.explain.recipe import Recipe
from kvstore.types import Ghost

Status = Literal["stored", "evicted", "other_recipe", "never_seen"]
"""A block's state, the first that holds: stored here; left the store and still in the ghost
record (evicted, deleted, corrupt or lost: the ghost says which); its tokens stored under
another namespace's recipe; none of these."""

STATUSES: tuple[Status, ...] = ("stored", "evicted", "other_recipe", "never_seen")


class OtherRecipe(NamedTuple):
    """A namespace whose recipe differs (``differs``: some of ``hash_algo``, ``hash_seed``,
    ``block_size``) that holds a block's tokens under its own hashes."""

    namespace: str
    differs: list[str]


class Elsewhere(NamedTuple):
    """A namespace with another recipe that holds ``blocks`` of the prompt's missing blocks
    (counted in this namespace's blocks)."""

    namespace: str
    recipe: Recipe
    differs: list[str]
    blocks: int


@dataclass(slots=True)
class BlockReport:
    """Block ``index``: tokens ``[start, end)``, its ``hash`` under the namespace's recipe,
    every tier holding it (top first), the ghost of its departure and the other namespaces
    that hold its tokens (the last two only for a block not stored)."""

    index: int
    start: int
    end: int
    hash: bytes
    status: Status = "never_seen"
    tiers: list[str] = field(default_factory=list)
    ghost: Ghost | None = None
    other: list[OtherRecipe] = field(default_factory=list)


@dataclass(slots=True)
class Explanation:
    """A prompt explained against one namespace. ``prefix_blocks`` leading blocks are stored
    (``prefix_tokens`` tokens: what an engine can load); ``first_miss`` is the index of the
    first block that is not (None: every block is). ``tail_tokens`` after the last full block
    are never hashed nor stored. ``counts`` has every status, zeros too; ``elsewhere`` the
    namespaces with another recipe that hold some of the missing blocks' tokens."""

    namespace: str
    recipe: Recipe
    tokens: int
    tail_tokens: int
    prefix_blocks: int
    prefix_tokens: int
    first_miss: int | None
    counts: dict[str, int]
    blocks: list[BlockReport]
    elsewhere: list[Elsewhere]
    hints: list[str]
