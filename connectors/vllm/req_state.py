"""What the connector's scheduler half remembers of one request between steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from connectors.vllm.seg_links import Pins

if TYPE_CHECKING:
    from vllm.v1.request import Request

    from kvstore.client import Grant


@dataclass(slots=True)
class ReqState:
    """One request as the scheduler half sees it: vLLM's request object (whose
    ``block_hashes`` grow as tokens are computed), its pages per KV cache group, how far each
    segment is saved, and the last lookup's grants and pins."""

    request: Request
    block_ids: list[list[int]] = field(default_factory=list)  # per KV cache group
    # per segment, leading blocks the store holds or a queued save will hold (a sliding
    # segment: whose windows need no saving)
    saved: list[int] = field(default_factory=list)
    branch: int = 0  # where the store's full prefix ended beyond a hit: a proven branch point
    hit_blocks: int = 0  # leading blocks the last lookup found
    hit_tiers: list[str] = field(default_factory=list)
    # the last lookup's grant per segment (and where it starts), until a load takes them
    grants: list[tuple[int, Grant] | None] = field(default_factory=list)
    granted_at: float = 0.0
    grant_pins: list[Pins] = field(default_factory=list)  # the grants', while no load holds them
    load_pins: list[Pins] = field(default_factory=list)  # held for the in-flight load
