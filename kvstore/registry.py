"""Lazy registry of named implementations ("module:Class"), so that optional dependencies
(lmdb, boto3, torch, cupy) are imported only when their part is chosen."""

from __future__ import annotations

import importlib
from typing import Any


class Registry:
    def __init__(self, what: str, entries: dict[str, str]) -> None:
        self.what = what
        self._entries = dict(entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def resolve(self, name: str) -> Any:
        try:
            target = self._entries[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.what} {name!r}; known: {', '.join(self.names())}"
            ) from None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def create(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.resolve(name)(*args, **kwargs)
