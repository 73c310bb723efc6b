"""kvstore's vLLM connector: ``kv_connector_module_path="connectors.vllm"``,
``kv_connector="KVStoreConnector"``.

``KVStoreConnector`` is imported on first access, so the connector's vLLM-free parts (config,
layout) stay importable without vLLM installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KVStoreConnector"]


def __getattr__(name: str) -> Any:
    if name == "KVStoreConnector":
        from connectors.vllm.connector import KVStoreConnector

        return KVStoreConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
