"""Admission rules: whether a block may be written to the tier a rule guards."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvstore.policy.base import Admission
from kvstore.types import BlockKey


class AlwaysAdmit(Admission):
    """Admits every block; the default for memory tiers, where a write costs little."""

    name = "always"

    def on_access(self, key: BlockKey) -> None:
        pass

    def admit(self, key: BlockKey) -> bool:
        return True

    def on_access_many(self, keys: Sequence[BlockKey]) -> None:
        pass

    def admit_many(self, keys: Sequence[BlockKey]) -> list[bool]:
        return [True] * len(keys)


class SeenTwice(Admission):
    """Admits a block once it has been accessed at least twice among recent accesses.

    Guards a slow tier (disk, S3) against one-hit blocks: a block written once and never read
    again would cost a write and a slot there for nothing.

    Memory bound: one ``OrderedDict`` of at most ``max_keys`` keys with a count capped at 2,
    least recently accessed dropped first. Measured on CPython 3.11: about 105 bytes of
    ``OrderedDict`` entry per key, plus about 120 bytes for the key itself when the store does
    not share its tuple (short namespace, 32-byte hash), so the default 100,000 keys stay
    under 25 MB.
    The rule is therefore "seen twice within the last ``max_keys`` distinct keys accessed":
    a key whose accesses are further apart is treated as seen once, which is the intent (a
    block reused only that rarely is not worth a slow-tier slot). The window is exact, with no
    false admissions, unlike a count-min sketch of the same purpose.
    """

    name = "seen_twice"

    def __init__(self, max_keys: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self._counts: OrderedDict[BlockKey, int] = OrderedDict()

    def on_access(self, key: BlockKey) -> None:
        self.on_access_many((key,))

    def on_access_many(self, keys: Sequence[BlockKey]) -> None:
        for key in keys:
            count = self._counts.get(key)
            if count is None:
                self._counts[key] = 1
                if len(self._counts) > self.max_keys:
                    self._counts.popitem(last=False)
            else:
                self._counts[key] = 2
                self._counts.move_to_end(key)

    def admit(self, key: BlockKey) -> bool:
        return self._counts.get(key, 0) >= 2

    def admit_many(self, keys: Sequence[BlockKey]) -> list[bool]:
        get = self._counts.get
        return [get(key, 0) >= 2 for key in keys]

    def forget(self, key: BlockKey) -> None:
        self._counts.pop(key, None)

    def __len__(self) -> int:
        """Keys remembered now; never more than ``max_keys``."""
        return len(self._counts)
