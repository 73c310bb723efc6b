"""Seeded traffic of the kind KV caches exist for: multi-turn chats, tenants' shared system
prompts, RAG documents of Zipf popularity and one-off prompts, with bursty arrivals.

:func:`generate` turns a :class:`WorkloadConfig` into a list of :class:`Request` s sorted by
arrival time; the same config gives the same requests, token for token. Sessions arrive as a
Gamma renewal process (shape ``burstiness``: 1 is Poisson, below 1 bursty, as BurstGPT
observed); each session is one of:

- ``chat``: a tenant's system prompt, then ``turns`` user messages; each turn resends the
  whole history (system prompt, earlier messages and answers) plus the new message, and
  arrives a think time after the previous one. The answer tokens in the history are the
  generator's own (as long as the previous turn's ``max_tokens``), so that the arrivals do not
  depend on what a model says; ``after`` names the previous turn, which a client should let
  finish before sending the next;
- ``rag``: a tenant's system prompt, one document of a shared corpus drawn with Zipf
  popularity (rank ``k`` with weight ``1 / k**zipf_s``) and a question;
- ``oneoff``: a prompt that shares nothing.

System prompts are ``system_len`` long (few tenants: a drawn length would set the mean);
other lengths are log-normal around their means (sigma ``length_sigma``) and clipped to
``[1, max_prompt]`` (prompts) or ``[1, max_output]`` (outputs); a chat whose history would
pass ``max_prompt`` ends there. The defaults are full-scale figures from published traces:
user messages of 161 tokens and answers of 338 (ShareGPT, as reported in the vLLM paper, Kwon
et al., SOSP 2023); RAG and one-off answers of 182 tokens and RAG prompts near Mooncake's
mean input of 7,590 tokens (system prompt + document + question; Mooncake's open trace, Qin et
al. 2024); Zipf popularity of reused content and Gamma-shaped bursty arrivals (BurstGPT, Wang
et al. 2024). The mix, tenant count, system prompt length, turns per chat and think time are
our choices. :meth:`WorkloadConfig.scaled` shrinks every length by one factor, for engines
(such as the tiny CPU models of the tests and benches) that cannot serve full-size prompts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("chat", "rag", "oneoff")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What the generator draws from. Lengths in tokens, times in seconds."""

    seed: int = 0  # shapes and arrivals
    salt: int = 0  # token values only: same shapes, no shared prefixes across salts
    sessions: int = 200
    session_rate: float = 2.0  # new sessions per second (mean)
    burstiness: float = 0.5  # Gamma shape of session inter-arrivals (1: Poisson)
    chat_share: float = 0.5
    rag_share: float = 0.3  # the rest are one-off prompts
    tenants: int = 4
    system_len: int = 1500
    turns_mean: float = 4.0  # geometric, at least 1
    user_len: int = 161  # ShareGPT
    chat_output_len: int = 338  # ShareGPT
    think_s: float = 8.0  # mean (exponential) gap between a chat's turns
    docs: int = 64
    doc_len: int = 5900  # with system_len and user_len: Mooncake's 7,590 mean input
    zipf_s: float = 1.0
    output_len: int = 182  # Mooncake, for rag and one-off requests
    oneoff_len: int = 2000
    length_sigma: float = 0.5
    max_prompt: int = 16384
    max_output: int = 2048
    vocab: int = 32000
    first_token: int = 3  # token ids start here (below: special tokens)

    def __post_init__(self) -> None:
        if self.sessions < 0 or self.tenants < 1 or self.docs < 1:
            raise ValueError("sessions >= 0, tenants >= 1 and docs >= 1 are required")
        if self.session_rate <= 0 or self.burstiness <= 0 or self.turns_mean < 1:
            raise ValueError("session_rate and burstiness must be > 0, turns_mean >= 1")
        if not (self.chat_share >= 0 and self.rag_share >= 0
                and self.chat_share + self.rag_share <= 1):
            raise ValueError("chat_share and rag_share must be fractions summing to <= 1")
        if self.vocab <= self.first_token:
            raise ValueError("vocab must exceed first_token")

    def scaled(self, factor: float, outputs: float | None = None,
               **changes: Any) -> WorkloadConfig:
        """Every length (prompt parts, outputs, caps) times ``factor``, at least 1 token;
        with ``outputs``, the output lengths (answers, which a chat's history also carries,
        and their cap) times that instead; ``changes`` replace fields after scaling."""
        prompts = ("system_len", "user_len", "doc_len", "oneoff_len", "max_prompt")
        answers = ("chat_output_len", "output_len", "max_output")
        out = factor if outputs is None else outputs
        sized = {n: max(1, round(getattr(self, n) * f))
                 for names, f in ((prompts, factor), (answers, out)) for n in names}
        return dataclasses.replace(self, **{**sized, **changes})


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the workload."""

    index: int  # position in the arrival order
    at: float  # arrival, seconds after the first session starts
    kind: str  # one of KINDS
    session: str  # chat turns share it; affinity routers hash it
    turn: int
    tenant: int  # -1 for one-off prompts
    prompt: list[int]
    max_tokens: int
    after: int | None = None  # index of the request that must finish first (previous turn)
    doc: int = -1  # the RAG document's popularity rank (0 most popular), -1 otherwise


class _Draw:
    """The generator's random draws: shapes from ``seed``, token values from ``salt``."""

    def __init__(self, cfg: WorkloadConfig) -> None:
        self.cfg = cfg
        self.shape = np.random.default_rng([cfg.seed, 0])
        self.toks = np.random.default_rng([cfg.seed, cfg.salt, 1])

    def length(self, mean: int, cap: int) -> int:
        sigma = self.cfg.length_sigma
        value = self.shape.lognormal(math.log(mean) - sigma * sigma / 2, sigma)
        return int(min(cap, max(1, round(value))))

    def tokens(self, n: int) -> list[int]:
        return self.toks.integers(self.cfg.first_token, self.cfg.vocab, n).tolist()


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Popularity of ranks ``0..n-1``: ``1 / (k + 1)**s``, normalised."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def generate(cfg: WorkloadConfig) -> list[Request]:
    """The workload's requests, sorted by arrival (ties keep generation order)."""
    d = _Draw(cfg)
    systems = [d.tokens(min(cfg.system_len, cfg.max_prompt)) for _ in range(cfg.tenants)]
    docs = [d.tokens(d.length(cfg.doc_len, cfg.max_prompt)) for _ in range(cfg.docs)]
    popularity = zipf_weights(cfg.docs, cfg.zipf_s)
    drafts: list[tuple[float, int, Request]] = []  # (arrival, order, request without index)
    t = 0.0
    for s in range(cfg.sessions):
        t += d.shape.gamma(cfg.burstiness, 1.0 / (cfg.burstiness * cfg.session_rate))
        u = d.shape.random()
        kind = "chat" if u < cfg.chat_share else "rag" if u < cfg.chat_share + \
            cfg.rag_share else "oneoff"
        tenant = int(d.shape.integers(cfg.tenants))
        sid = f"s{cfg.seed}-{s}"
        if kind == "chat":
            drafts += _chat(d, t, sid, tenant, systems[tenant], len(drafts))
        elif kind == "rag":
            rank = int(d.shape.choice(cfg.docs, p=popularity))
            prompt = systems[tenant] + docs[rank] + d.tokens(d.length(cfg.user_len,
                                                                       cfg.max_prompt))
            drafts.append((t, len(drafts), Request(0, t, kind, sid, 0, tenant,
                                                   prompt[:cfg.max_prompt],
                                                   d.length(cfg.output_len, cfg.max_output),
                                                   doc=rank)))
        else:
            prompt = d.tokens(d.length(cfg.oneoff_len, cfg.max_prompt))
            drafts.append((t, len(drafts), Request(0, t, kind, sid, 0, -1, prompt,
                                                   d.length(cfg.output_len, cfg.max_output))))
    drafts.sort(key=lambda x: (x[0], x[1]))
    index = {order: i for i, (_, order, _) in enumerate(drafts)}
    return [dataclasses.replace(r, index=i, after=None if r.after is None else index[r.after])
            for i, (_, _, r) in enumerate(drafts)]


def _chat(d: _Draw, t: float, sid: str, tenant: int, system: list[int],
          order0: int) -> list[tuple[float, int, Request]]:
    """One chat session's turns; ``after`` holds generation order until :func:`generate`
    maps it to arrival order."""
    cfg = d.cfg
    turns = int(d.shape.geometric(1.0 / cfg.turns_mean))
    history = list(system)
    out: list[tuple[float, int, Request]] = []
    for turn in range(turns):
        history += d.tokens(d.length(cfg.user_len, cfg.max_prompt))
        if len(history) > cfg.max_prompt and turn:
            break
        max_tokens = d.length(cfg.chat_output_len, cfg.max_output)
        prev = order0 + len(out) - 1 if turn else None
        out.append((t, order0 + len(out), Request(0, t, "chat", sid, turn, tenant,
                                                  history[:cfg.max_prompt], max_tokens, prev)))
        history += d.tokens(max_tokens)  # the answer, as the next turn resends it
        t += d.shape.exponential(cfg.think_s)
    return out


def reuse_bound(reqs: list[Request], block_size: int) -> float:
    """The prefix hit rate of one cache that never evicts, on ``reqs`` in arrival order: the
    fraction of prompt tokens in leading full blocks some earlier prompt began with (the last
    prompt token is always computed, as engines do). No router or fleet can beat it."""
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    hit = total = 0
    for r in reqs:
        parent, reusing = -1, True
        full = (len(r.prompt) - 1) // block_size
        for b in range(full):
            key = (parent, tuple(r.prompt[b * block_size:(b + 1) * block_size]))
            known = seen.get(key)
            if known is None:
                reusing = False
                known = seen[key] = len(seen)
            elif reusing:
                hit += block_size
            parent = known
        total += len(r.prompt)
    return hit / total if total else 0.0
