"""Pieces every benchmark shares: machine facts, interleaved timing, the JSON report every
bench writes (each row a case, its value and unit, its baseline and ratio, its target) and a
plain table."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any


def version(dist: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine(*dists: str, **extra: Any) -> dict[str, Any]:
    """The ``machine`` block of a report: CPUs, Python, load, the versions of ``dists``
    (torch always) and whatever the bench adds."""
    doc: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1min": round(os.getloadavg()[0], 2),
    }
    for dist in ("torch", *dists):
        doc[dist] = version(dist)
    doc.update(extra)
    return doc


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(
    cases: Sequence[Callable[[], object]], reps: int, warmup: int = 2
) -> list[float]:
    """Median seconds of each case, run A B C A B C ... after ``warmup`` rounds, so that a
    noisy neighbour slows every case alike."""
    for _ in range(warmup):
        for fn in cases:
            fn()
    samples: list[list[float]] = [[] for _ in cases]
    for _ in range(reps):
        for i, fn in enumerate(cases):
            samples[i].append(timed(fn))
    return [statistics.median(s) for s in samples]


def row(
    case: str,
    unit: str,
    value: float,
    baseline: str | None = None,
    baseline_value: float | None = None,
    *,
    higher_is_better: bool,
    target: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One result row; ``ratio`` is oriented so that higher is always better."""
    ratio = None
    if baseline_value is not None and value:
        ratio = value / baseline_value if higher_is_better else baseline_value / value
    meets = None if target is None or ratio is None else ratio >= target
    return {
        "case": case, **extra, "unit": unit, "value": value, "baseline": baseline,
        "baseline_value": baseline_value, "ratio": ratio, "target": target,
        "meets_target": meets,
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """``rows`` as a plain table, one column per key any row has."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(x, widths, strict=True)) for x in cells]
    return "\n".join(lines)


def report(bench: str, rows: list[dict[str, Any]], json_path: str | None,
           extra: dict[str, Any] | None = None) -> None:
    """Print ``rows`` as a table and write the JSON report when asked (with ``extra``'s
    keys beside ``rows``)."""
    print(table(rows))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        doc = {"bench": bench, "machine": machine(), "rows": rows, **(extra or {})}
        Path(json_path).write_text(json.dumps(doc, indent=1))
        print(f"wrote {json_path}")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
