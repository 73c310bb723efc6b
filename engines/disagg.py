"""Disaggregated prefill -> decode through kvstore.

A prefill worker computes a prompt's KV and puts its full blocks into kvstore; the decode
worker is then sent the prompt and the block hashes (the :class:`Handoff`), never tensors. The
decode worker checks the hashes against its own recipe, loads the blocks from kvstore as a
prefix hit, computes only the tail that does not fill a block, and generates. The router calls
:func:`prefill_then_decode` when it has prefill workers; :func:`run` is the synchronous form for
scripts and tests.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import httpx

from engines.messages import PrefillReply, PrefillRequest


class Handoff(NamedTuple):
    """What crosses from the prefill worker to the decode worker."""

    prompt_ids: list[int]
    block_hashes: list[str]  # hex, in prompt order
    namespace: str
    prefill_s: float


async def prefill(client: httpx.AsyncClient, url: str, prompt_ids: list[int],
                  cache_salt: str | None = None) -> Handoff:
    """Have ``url`` compute and store the prompt's blocks (hashed with ``cache_salt``).
    Raises ``httpx.HTTPError``."""
    body = PrefillRequest(prompt_ids=prompt_ids, cache_salt=cache_salt)
    r = await client.post(f"{url}/prefill", json=body.model_dump(exclude_none=True))
    r.raise_for_status()
    doc = PrefillReply.model_validate_json(r.content)
    return Handoff(doc.prompt_ids, doc.block_hashes, doc.namespace, doc.latency_s)


def decode_body(handoff: Handoff, body: dict[str, Any]) -> dict[str, Any]:
    """The decode worker's ``/generate`` body: the request plus the handoff's hashes."""
    return {**body, "prompt_ids": handoff.prompt_ids, "block_hashes": handoff.block_hashes}


async def prefill_then_decode(client: httpx.AsyncClient, prefill_url: str, decode_url: str,
                              body: dict[str, Any]) -> dict[str, Any]:
    """Non-streaming disaggregated generation; the decode reply plus ``prefill_s``."""
    handoff = await prefill(client, prefill_url, body["prompt_ids"], body.get("cache_salt"))
    r = await client.post(f"{decode_url}/generate", json=decode_body(handoff, body))
    r.raise_for_status()
    return {**r.json(), "prefill_s": handoff.prefill_s}


def run(prefill_url: str, decode_url: str, body: dict[str, Any],
        timeout: float = 300.0) -> dict[str, Any]:
    """Synchronous :func:`prefill_then_decode`."""

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=timeout) as client:
            return await prefill_then_decode(client, prefill_url, decode_url, body)

    return asyncio.run(go())
