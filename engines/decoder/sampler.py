"""Sampling: greedy, or temperature with nucleus (top-p) filtering, seeded per request.

Each request owns a ``torch.Generator`` so that its sampled tokens depend only on its seed and
its logits, never on which other requests shared the batch.

Temperatures follow vLLM's rule, so that a client moving between the two sees the same
behaviour: below ``GREEDY_BELOW`` (1e-5) a temperature means greedy (OpenAI documents 0 as
"most deterministic" and clients send tiny values to mean it); between that and
``MIN_TEMPERATURE`` (0.01) it is raised to 0.01, because ``logits / t`` overflows float32 for
smaller ``t`` and the softmax turns to NaN. Values no sampler can use (negative, NaN,
infinite, ``top_p`` outside (0, 1]) are refused with ``ValueError`` when the parameters are
made, before the request reaches a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

GREEDY_BELOW = 1e-5  # a temperature below this is greedy (vLLM's _SAMPLING_EPS)
MIN_TEMPERATURE = 1e-2  # smaller positive temperatures are raised to this (vLLM's _MAX_TEMP)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """``temperature`` 0 is greedy; ``seed`` None draws a fresh seed. Made with a tiny
    temperature, the fields hold the effective values (0 for greedy, else at least
    ``MIN_TEMPERATURE``)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must fit in 64 bits, got {self.seed}")
        if self.temperature < GREEDY_BELOW:
            object.__setattr__(self, "temperature", 0.0)
        elif self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.temperature == 0:
        return None
    g = torch.Generator()
    if params.seed is None:
        g.seed()
    else:
        g.manual_seed(params.seed)
    return g


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    """Next token from one row of float32 logits ``[vocab]``. Raises ``ValueError`` when the
    row gives no distribution to draw from (NaN or infinite logits): the caller fails only
    this request."""
    if params.temperature == 0 or gen is None:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float().cpu() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        # keep the smallest set whose mass reaches top_p: a token stays if the mass before it
        # is still below top_p; the most likely token always stays, even for a top_p that
        # float32 rounds to 0
        keep = (torch.cumsum(sorted_p, 0) - sorted_p) < params.top_p
        keep[0] = True
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    total = float(probs.sum())
    if not math.isfinite(total) or total <= 0 or not bool(torch.isfinite(probs).all()):
        raise ValueError("the logits give no distribution to sample from (NaN or infinite)")
    return int(torch.multinomial(probs / total, 1, generator=gen))
