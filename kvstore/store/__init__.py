"""The store: a facade (:class:`Store`) over parts that each own their state; see
:mod:`kvstore.store.facade` for the parts and ``docs/store_api.md`` for the methods."""

from __future__ import annotations

from kvstore.store.api import StoreAPI
from kvstore.store.facade import Store
from kvstore.store.report import IntegrityError

__all__ = ["IntegrityError", "Store", "StoreAPI"]
