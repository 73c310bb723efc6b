"""kvstore: a tiered KV-cache block store for LLM inference engines."""

from __future__ import annotations

__version__ = "0.1.0"
