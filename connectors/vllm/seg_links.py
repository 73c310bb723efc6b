"""A segment as the connector's scheduler side reaches it: its link, the pins it holds there,
and the window lookups that find where a hybrid model's hit may end.

A full-attention segment answers for the whole prefix with one lookup. A sliding-window
segment needs only the window before the hit's end, so :func:`window_hit` looks for the last
boundary, at or before the full segments' prefix, whose window every sliding segment holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.vllm.segments import Segment
from connectors.vllm.store_link import StoreLink
from kvstore.types import BlockHash

MAX_WINDOW_LOOKUPS = 8  # per segment and lookup: a hit further back is not worth the trips


@dataclass(frozen=True, slots=True)
class SegLink:
    """One segment as the scheduler uses it: its link, its groups' indices among vLLM's,
    and (sliding windows) what a hit needs and what is worth storing."""

    link: StoreLink
    groups: tuple[int, ...] = (0,)
    segment: Segment | None = None

    @property
    def window(self) -> int:
        return self.segment.window_blocks if self.segment is not None else 0

    @property
    def block_bytes(self) -> int:
        return self.segment.layout.block_bytes if self.segment is not None \
            else self.link.block_bytes

    def keeps(self, i: int, boundaries: tuple[int, ...]) -> bool:
        return self.segment is None or self.segment.keeps(i, boundaries)


@dataclass(slots=True)
class Pins:
    """Pins the scheduler holds in one segment's namespace: ``plain`` from ``pin``,
    ``granted`` by a lookup. Pins are counted, so each is released exactly once:
    :meth:`release` empties the object, and whoever still holds it afterwards releases
    nothing."""

    link: StoreLink
    plain: list[bytes] = field(default_factory=list)
    granted: list[BlockHash] = field(default_factory=list)

    def release(self) -> None:
        plain, granted = self.plain, self.granted
        self.plain, self.granted = [], []
        self.link.release(plain)
        self.link.release_grant(granted)


def release_all(pins: list[Pins]) -> None:
    for p in pins:
        p.release()


def window_hit(segs: Sequence[SegLink], hashes: Sequence[Any], end: int, local: int) -> int:
    """The longest hit of at most ``end`` blocks (and more than ``local``, vLLM's own) for
    which every sliding segment of ``segs`` holds the window before its end; 0 if none."""
    windows = [seg for seg in segs if seg.window]
    while windows and end > local:
        before = end
        for seg in windows:
            end = _window_end(seg, hashes, end, local)
        if end == before:
            break
    return end if end > local else 0


def _window_end(seg: SegLink, hashes: Sequence[Any], end: int, local: int) -> int:
    """The last boundary at or before ``end`` with ``seg``'s window stored before it. Each
    lookup asks for the window backwards, so the answer's length says where the nearest
    missing block is, and no boundary after it can do. The first candidates are ``end`` and
    the boundary just before its miss (a prompt's end is kept wherever it lies); after that
    the search jumps to the stride boundary at or before each miss, where windows are kept,
    so a long window is found in a few lookups, not one per block."""
    stride = seg.segment.stride_blocks if seg.segment is not None else 0
    for attempt in range(MAX_WINDOW_LOOKUPS):
        if end <= local:
            return 0
        start = max(0, end - seg.window)
        run, _tiers = seg.link.lookup_tiers([hashes[i] for i in range(end - 1, start - 1, -1)])
        if run >= end - start:
            return end
        miss = end - run - 1  # the nearest block not stored: a window must end at or before it
        end = miss if attempt == 0 or not stride else miss // stride * stride
    return 0
