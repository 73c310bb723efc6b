"""What a simulation reports: the real routing bench's metrics (``bench/engine_routing.py``
``summarize``) from the simulated clients' outcomes, per policy and with or without kvstore,
as a table and as JSON rows.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from engines.simulator.fleet import Outcome
from engines.simulator.traffic import Targets

# (label, key, unit, higher is better), in the real bench's order
METRICS = (("TTFT p50", "ttft_p50", "s", False), ("TTFT p99", "ttft_p99", "s", False),
           ("ITL p50", "itl_p50", "s", False), ("throughput", "tokens_per_s", "tokens/s", True),
           ("prefix hit rate", "hit_rate", "fraction", True),
           ("goodput", "goodput", "requests/s", True))


def summarize(out: list[Outcome], t: Targets) -> dict[str, float]:
    """TTFT p50/p99, ITL p50, output tokens/s, prefix hit rate, goodput (requests/s meeting
    both targets) and the busiest worker's share of the requests."""
    if not out:
        raise ValueError("no requests were served")
    ttft = np.array([o.ttft for o in out])
    itl = np.array([o.itl for o in out])
    wall = max(o.end for o in out)
    good = sum(1 for o in out if o.ttft <= t.ttft_target_s and o.itl <= t.itl_target_s)
    prompt = sum(o.prompt_tokens for o in out)
    busiest = max(Counter(o.worker for o in out).values()) / len(out)
    return {"ttft_p50": float(np.percentile(ttft, 50)),
            "ttft_p99": float(np.percentile(ttft, 99)),
            "itl_p50": float(np.percentile(itl, 50)),
            "tokens_per_s": sum(o.tokens for o in out) / wall,
            "hit_rate": sum(o.hit_tokens for o in out) / prompt if prompt else 0.0,
            "goodput": good / wall, "good_fraction": good / len(out),
            "requests": len(out), "busiest_worker_share": busiest}


def table(results: dict[tuple[str, bool], dict[str, float]], title: str) -> str:
    """One line per policy and kvstore setting, the metrics as columns."""
    keys = [k for _, k, _, _ in METRICS] + ["busiest_worker_share"]
    heads = [k for k in keys[:-1]] + ["busiest_share"]
    lines = [title, f"{'policy':<13} {'kvstore':<8}" + "".join(f"{k:>14}" for k in heads)]
    for (policy, store), m in results.items():
        lines.append(f"{policy:<13} {store!s:<8}" + "".join(f"{m[k]:>14.4g}" for k in keys))
    return "\n".join(lines)


def ratio(value: float, base: float, higher: bool) -> float | None:
    """``value`` against ``base`` so that higher is better (as bench/common.py reports), None
    without one."""
    if higher:
        return value / base if base else None
    return base / value if value else None


def rows(results: dict[tuple[str, bool], dict[str, float]], **context: Any) -> list[dict[str, Any]]:
    """Report rows (bench/common.py): each policy's metrics against round-robin with the same
    kvstore setting (round-robin itself is the baseline and has no row)."""
    out = []
    for (policy, store), m in results.items():
        base = results.get(("round-robin", store))
        for label, key, unit, higher in METRICS:
            tag = ", with kvstore" if store else ""
            b = base[key] if base is not None and policy != "round-robin" else None
            r = ratio(m[key], b, higher) if b is not None else None
            out.append({"case": f"{label}, {policy}{tag}", "unit": unit, "value": m[key],
                        "baseline": f"round-robin{tag}" if b is not None else None,
                        "baseline_value": b, "ratio": r, "target": None,
                        "meets_target": None, **context})
    return out
