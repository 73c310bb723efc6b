"""Disaggregated prefill -> decode through kvstore.

A prefill worker computes a prompt's KV and puts its full blocks into kvstore; the decode
worker is then sent the prompt and the block hashes (the :class:`Handoff`), never tensors. The
decode worker checks the hashes against its own recipe, loads the blocks from kvstore as a
prefix hit, computes only the tail that does not fill a block, and generates. A router with
prefill workers calls :func:`prefill` and sends :func:`decode_request` on;
:func:`prefill_then_decode` does both (:func:`run` is its synchronous form, for scripts).
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import httpx

from engines.messages import GenerateReply, GenerateRequest, PrefillReply, PrefillRequest


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


def decode_request(handoff: Handoff, req: GenerateRequest) -> GenerateRequest:
    """The decode worker's request: ``req`` with the handoff's prompt and hashes."""
    return req.model_copy(update={"prompt_ids": handoff.prompt_ids,
                                  "block_hashes": handoff.block_hashes})


class Disaggregated(NamedTuple):
    """A disaggregated generation: the decode worker's reply and the prefill's latency."""

    reply: GenerateReply
    prefill_s: float


async def prefill_then_decode(client: httpx.AsyncClient, prefill_url: str, decode_url: str,
                              req: GenerateRequest) -> Disaggregated:
    """Non-streaming disaggregated generation. Raises ``httpx.HTTPError``, and
    ``pydantic.ValidationError`` for a decode answer that is no reply."""
    handoff = await prefill(client, prefill_url, req.prompt_ids, req.cache_salt)
    r = await client.post(f"{decode_url}/generate", content=decode_request(handoff, req).wire(),
                          headers={"content-type": "application/json"})
    r.raise_for_status()
    return Disaggregated(GenerateReply.model_validate_json(r.content), handoff.prefill_s)


def run(prefill_url: str, decode_url: str, req: GenerateRequest,
        timeout: float = 300.0) -> Disaggregated:
    """Synchronous :func:`prefill_then_decode`."""

    async def go() -> Disaggregated:
        async with httpx.AsyncClient(timeout=timeout) as client:
            return await prefill_then_decode(client, prefill_url, decode_url, req)

    return asyncio.run(go())
