"""The simulated workers' speeds: one JSON of rates, calibrated from a real run.

A simulated step that prefills ``p`` tokens, decodes ``d`` sequences and loads ``l`` tokens
from kvstore takes::

    step_overhead_s + p / prefill_tokens_per_s + d / decode_tokens_per_s + l / load_tokens_per_s

so ``decode_tokens_per_s`` is the *marginal* rate of one more sequence in the batch and
``step_overhead_s`` what a step costs whatever it holds (launches, sampling, Python). A
request also pays ``request_overhead_s`` once, between the client and the engine (HTTP,
router), which the client sees in its time to first token.

The file is what :meth:`SimRates.save` writes (and ``bench/bench_simulate.py --rates-out``
or :func:`engines.simulator.calibrate.measure` produce)::

    {"prefill_tokens_per_s": 11000, "decode_tokens_per_s": 3700, "load_tokens_per_s": 80000,
     "step_overhead_s": 0.0025, "request_overhead_s": 0.012}

Missing keys take the defaults of :class:`SimRates`: what ``bench/bench_simulate.py
--calibrate`` measured for the routing bench's model on a 2-core CPU machine (one worker
process, the router a thread of the client's process, as in ``bench/engine_routing.py``),
rounded; except the load rate, which a worker without kvstore cannot measure (a guess).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class SimRates:
    """Rates in tokens per second, overheads in seconds."""

    prefill_tokens_per_s: float = 11_000.0
    decode_tokens_per_s: float = 3_700.0  # marginal: one more sequence in a step's batch
    load_tokens_per_s: float = 80_000.0  # prompt tokens copied in from kvstore (a guess)
    step_overhead_s: float = 0.0025  # every step, whatever its batch
    request_overhead_s: float = 0.012  # once per request: client, router, HTTP and SSE

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or value != value:
                raise ValueError(f"{f.name} must be a number, not {value!r}")
            if f.name.endswith("_per_s") and value <= 0:
                raise ValueError(f"{f.name} must be > 0 tokens/s, not {value}")
            if f.name.endswith("_overhead_s") and value < 0:
                raise ValueError(f"{f.name} must be >= 0 s, not {value}")

    def step_seconds(self, prefill: int, decode: int, load: int = 0) -> float:
        """Seconds of one step that prefills ``prefill`` tokens, decodes ``decode`` sequences
        and loads ``load`` tokens from kvstore."""
        return (self.step_overhead_s + prefill / self.prefill_tokens_per_s
                + decode / self.decode_tokens_per_s + load / self.load_tokens_per_s)

    def reported(self) -> dict[str, float]:
        """The rates a worker reports in ``/info`` (what the router's cost model reads)."""
        return {"prefill_tokens_per_s": self.prefill_tokens_per_s,
                "decode_tokens_per_s": self.decode_tokens_per_s,
                "load_tokens_per_s": self.load_tokens_per_s}

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> SimRates:
        """Rates from a JSON object; ``ValueError`` naming an unknown key or a bad value."""
        if not isinstance(doc, dict):
            raise ValueError("rates must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ValueError(f"unknown rate {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in doc.items() if v is not None})

    @classmethod
    def load(cls, path: str | Path) -> SimRates:
        """Rates from a JSON file; ``OSError`` or ``ValueError`` when it cannot be used."""
        try:
            doc = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        return cls.from_dict(doc)

    @classmethod
    def from_info(cls, rates: dict[str, Any], **overheads: float) -> SimRates:
        """From a real worker's ``/info`` ``rates`` (rates it has not measured yet keep the
        defaults). Its decode rate is per step of whatever batches it ran, so with
        ``step_overhead_s`` left at 0 this prices decode by the measured average;
        :func:`engines.simulator.calibrate.measure` separates the two."""
        keys = ("prefill_tokens_per_s", "decode_tokens_per_s", "load_tokens_per_s")
        doc: dict[str, Any] = {k: rates.get(k) for k in keys}
        return cls.from_dict({"step_overhead_s": 0.0, "request_overhead_s": 0.0,
                              **doc, **overheads})
