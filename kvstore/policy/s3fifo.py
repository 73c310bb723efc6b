"""S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23).

Three FIFO queues: *small* (new keys, about 10% of the tier), *main* (keys that proved useful)
and *ghost* (keys only, recently evicted from small). Hits only bump a counter capped at 3; all
reordering happens at eviction time, so hits stay O(1) and lock-free in spirit.

Sizing. The policy sees keys, not bytes: it is told ``on_put``/``on_remove`` and never learns
the tier's capacity. The store asks for victims only when the tier is over its watermark, i.e.
when the resident count *is* the capacity in blocks, so by default the small-queue target is
``small_ratio * len(self)`` taken at the moment ``victims`` is called, and the ghost is bounded
by ``ghost_ratio * len(self)``. This needs no configuration and follows a tier whose byte
capacity or block size changes. Pass ``capacity_hint`` (blocks) to pin both sizes instead, e.g.
when victims are requested ahead of need and the resident count is not yet the capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvstore.policy.base import Policy
from kvstore.types import BlockKey

_MAX_FREQ = 3


class S3FIFOPolicy(Policy):
    """S3-FIFO over three ``OrderedDict`` queues (first item = oldest), O(1) per event.

    ``victims`` does the queue moves the algorithm prescribes (small keys with a hit move to
    main; main keys with a hit are reinserted with their count decremented) and names keys with
    no hit left, keeping them in place: :meth:`on_remove` forgets them, and a key removed from
    small without a hit since its insertion is remembered in the ghost so that its return goes
    straight to main. Pinned keys are skipped and stay where they were.
    """

    name = "s3fifo"

    def __init__(
        self,
        small_ratio: float = 0.1,
        ghost_ratio: float = 0.9,
        capacity_hint: int | None = None,
    ) -> None:
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio must be in (0, 1), got {small_ratio}")
        if ghost_ratio < 0.0:
            raise ValueError(f"ghost_ratio must be >= 0, got {ghost_ratio}")
        if capacity_hint is not None and capacity_hint < 1:
            raise ValueError(f"capacity_hint must be >= 1 block, got {capacity_hint}")
        self.small_ratio = small_ratio
        self.ghost_ratio = ghost_ratio
        self.capacity_hint = capacity_hint
        self._small: OrderedDict[BlockKey, None] = OrderedDict()
        self._main: OrderedDict[BlockKey, None] = OrderedDict()
        self._ghost: OrderedDict[BlockKey, None] = OrderedDict()
        self._freq: dict[BlockKey, int] = {}  # every resident key, in exactly one of small/main

    def on_put(self, key: BlockKey, size: int) -> None:
        if key in self._freq:
            self.on_hit(key)
        elif key in self._ghost:
            # Evicted from small recently and back already: it has earned main directly.
            del self._ghost[key]
            self._freq[key] = 0
            self._main[key] = None
        else:
            self._freq[key] = 0
            self._small[key] = None

    def on_hit(self, key: BlockKey) -> None:
        freq = self._freq.get(key)
        if freq is not None and freq < _MAX_FREQ:
            self._freq[key] = freq + 1

    def on_remove(self, key: BlockKey) -> None:
        freq = self._freq.pop(key, None)
        if freq is None:
            return
        if key in self._small:
            del self._small[key]
            if freq == 0:
                # A one-hit wonder leaving small: exactly the keys S3-FIFO keeps as ghosts.
                self._ghost[key] = None
                self._trim_ghost()
        else:
            del self._main[key]

    def victims(self, n: int, evictable: Callable[[BlockKey], bool]) -> list[BlockKey]:
        out: list[BlockKey] = []
        if n <= 0:
            return out
        capacity = self.capacity_hint if self.capacity_hint is not None else len(self._freq)
        small_target = max(1, round(self.small_ratio * capacity))
        # Keys named or skipped as pinned leave their queue for the rest of the call, so that
        # the loop ends, and return to the oldest end afterwards in their original order.
        held_small: list[BlockKey] = []
        held_main: list[BlockKey] = []
        small, main = self._small, self._main
        named_small = 0
        while len(out) < n and (small or main):
            # Small's size counts its pinned keys but not those already named: this call
            # simulates evicting the named keys one after another.
            small_size = len(small) + len(held_small) - named_small
            if small and (small_size >= small_target or not main):
                named_small += self._evict_small(evictable, out, held_small)
            else:
                self._evict_main(evictable, out, held_main)
        _restore_oldest(small, held_small)
        _restore_oldest(main, held_main)
        return out

    def __len__(self) -> int:
        return len(self._freq)

    def __contains__(self, key: object) -> bool:
        return key in self._freq

    @property
    def ghost_size(self) -> int:
        """Keys remembered in the ghost queue (not resident); bounded as the module says."""
        return len(self._ghost)

    def _evict_small(
        self, evictable: Callable[[BlockKey], bool], out: list[BlockKey], held: list[BlockKey]
    ) -> int:
        """Moves the oldest small key on; returns 1 if it was named as a victim."""
        key, _ = self._small.popitem(last=False)
        if self._freq[key] > 0:
            # Accessed since insertion: promote. As in the paper, the count is cleared on the
            # move, so the key stays in main only if it is hit again there.
            self._freq[key] = 0
            self._main[key] = None
            return 0
        held.append(key)
        if evictable(key):
            out.append(key)
            return 1
        return 0

    def _evict_main(
        self, evictable: Callable[[BlockKey], bool], out: list[BlockKey], held: list[BlockKey]
    ) -> None:
        key, _ = self._main.popitem(last=False)
        freq = self._freq[key]
        if freq > 0:
            self._freq[key] = freq - 1
            self._main[key] = None  # reinsert at the newest end
            return
        held.append(key)
        if evictable(key):
            out.append(key)

    def _trim_ghost(self) -> None:
        capacity = self.capacity_hint if self.capacity_hint is not None else len(self._freq)
        limit = max(1, int(self.ghost_ratio * capacity))
        while len(self._ghost) > limit:
            self._ghost.popitem(last=False)


def _restore_oldest(queue: OrderedDict[BlockKey, None], held: list[BlockKey]) -> None:
    for key in reversed(held):
        queue[key] = None
        queue.move_to_end(key, last=False)
