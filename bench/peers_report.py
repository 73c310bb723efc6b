"""The peers bench's cases and how its samples become rows: per case and store the median time
to first token against no cache, the prompt tokens that came from a cache, whether the tokens
matched no cache's, kvstore against the best peer, and each store's processes and memory.

Nothing here starts a process, so the report is tested without any peer installed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

NONE = "no cache"  # the floor: the engine recomputes every prompt
LIMIT = "vllm prefix cache"  # the engine's own cache holds the prefix: no store can beat it
KVSTORE = "kvstore"
CONCURRENT = "traffic_concurrent"


class Case(NamedTuple):
    key: str
    label: str
    target: float  # kvstore's TTFT against the best peer's (ratio of medians)
    limit: bool  # whether vLLM's own prefix cache has a meaning here
    base: str = ""  # the case whose no-cache samples are the baseline ("": its own)
    traffic: bool = False  # one sample per request of a trace: p99, hit share, throughput


CASES = (
    Case("repeated", "1. repeated prompt, fresh engine process, store warm", 1.0, True),
    Case(
        "repeated_again",
        "1b. the same prompt again, engine's own cache reset",
        1.0,
        False,
        "repeated",
    ),
    Case("new_question", "2. new question after a shared prefix", 1.0, True),
    Case(
        "traffic",
        "3. chat/RAG traffic, each request on a reset engine",
        1.0,
        True,
        traffic=True,
    ),
    Case(
        CONCURRENT,
        "3c. chat/RAG traffic, requests in flight at once",
        1.0,
        True,
        traffic=True,
    ),
    Case(
        "pressure",
        "4. capacity pressure, working set 4x each RAM tier",
        1.2,
        False,
        traffic=True,
    ),
    Case("restarted", "5. store restarted, then a fresh engine", 1.2, False),
)
NOT_RUN = {  # cases of the race not measured by this bench yet, and why
    "3. concurrent traffic": "requests run one at a time: no engine serves several at once, "
    "so throughput under load is not measured",
}
NOT_RUNNABLE = {  # stores that cannot run on this engine at all
    "vllm OffloadingConnector": "CUDA/XPU only in vLLM 0.32 (CPU offloading needs CUDA "
    "streams in the workers); cannot run on the CPU engine",
}


class Sample(NamedTuple):
    """One measured request: seconds to its first token, prompt tokens not computed, and
    whether its greedy tokens equal no cache's for the same prompt."""

    ttft: float
    cached: int
    identical: bool
    seconds: float = 0.0  # the whole request (traffic: throughput)
    prompt: int = 0  # prompt tokens (traffic: the share served from a cache)
    generated: int = 0


@dataclass
class Samples:
    """Every sample of one run, by case key and store name."""

    by: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)
    # a trace served with requests in flight at once: its wall seconds, first to last token
    walls: dict[tuple[str, str], float] = field(default_factory=dict)

    def add(self, case: str, store: str, sample: Sample) -> None:
        self.by.setdefault((case, store), []).append(sample)

    def get(self, case: str, store: str) -> list[Sample]:
        return self.by.get((case, store), [])


def median_ttft(samples: Sequence[Sample]) -> float:
    return statistics.median(s.ttft for s in samples)


def store_row(
    case: Case,
    store: str,
    samples: Sequence[Sample],
    base: Sequence[Sample],
    wall: float | None = None,
) -> dict[str, Any]:
    """One store on one case: median TTFT against no cache's (ratio: higher is better)."""
    value, base_value = median_ttft(samples), median_ttft(base)
    return {
        "case": case.label,
        "store": store,
        "unit": "s",
        "value": round(value, 4),
        "baseline": NONE,
        "baseline_value": round(base_value, 4),
        "ratio": round(base_value / value, 2) if value > 0 else None,
        "target": None,
        "meets_target": None,
        "cached_tokens": statistics.median(s.cached for s in samples),
        "tokens_identical": f"{sum(s.identical for s in samples)}/{len(samples)}",
        "samples": len(samples),
        "ttft_samples": [round(s.ttft, 4) for s in samples],
        **(traffic_fields(samples, wall) if case.traffic else {}),
    }


def traffic_fields(samples: Sequence[Sample], wall: float | None = None) -> dict[str, Any]:
    """A trace's tail, the share of its prompt tokens a cache supplied, and its throughput:
    prompt and generated tokens over the requests' seconds (one request at a time) or over
    the trace's ``wall`` seconds (requests in flight at once)."""
    ttfts = sorted(s.ttft for s in samples)
    p99 = ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))]
    prompt = sum(s.prompt for s in samples)
    seconds = wall if wall is not None else sum(s.seconds for s in samples)
    tokens = prompt + sum(s.generated for s in samples)
    return {
        "p99_s": round(p99, 4),
        "hit_share": round(sum(s.cached for s in samples) / prompt, 3) if prompt else None,
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
    }


def versus_row(case: Case, samples: Samples, peers: Sequence[str]) -> dict[str, Any] | None:
    """kvstore against the fastest peer that ran the case (None if either is missing)."""
    ran = [p for p in peers if samples.get(case.key, p)]
    mine = samples.get(case.key, KVSTORE)
    if not ran or not mine:
        return None
    best = min(ran, key=lambda p: median_ttft(samples.get(case.key, p)))
    value, base_value = median_ttft(mine), median_ttft(samples.get(case.key, best))
    ratio = base_value / value if value > 0 else None
    hits = statistics.median(s.cached for s in mine)
    # a trace's requests differ: the tokens a store supplied over all of them, not the median
    hit = sum if case.traffic else statistics.median
    best_hits = max(hit(s.cached for s in samples.get(case.key, p)) for p in ran)
    return {
        "case": case.label,
        "store": f"{KVSTORE} vs best peer",
        "unit": "s",
        "value": round(value, 4),
        "baseline": best,
        "baseline_value": round(base_value, 4),
        "ratio": None if ratio is None else round(ratio, 2),
        "target": case.target,
        "meets_target": None if ratio is None else ratio >= case.target,
        "cached_tokens": hits,
        "hit_tokens_at_least_best_peer": hit(s.cached for s in mine) >= best_hits,
    }


def case_rows(samples: Samples, stores: Sequence[str]) -> list[dict[str, Any]]:
    """Every measured row: per case, no cache, vLLM's own cache where it means something,
    each store, then kvstore against the best peer."""
    rows: list[dict[str, Any]] = []
    peers = [s for s in stores if s != KVSTORE]
    for case in CASES:
        base = samples.get(case.base or case.key, NONE)
        if not base:
            continue
        own_base = NONE if not case.base else None
        for store in (own_base, LIMIT if case.limit else None, *stores):
            if store is not None and samples.get(case.key, store):
                wall = samples.walls.get((case.key, store))
                rows.append(store_row(case, store, samples.get(case.key, store), base, wall))
        versus = versus_row(case, samples, peers)
        if versus is not None:
            rows.append(versus)
    return rows


def skipped_rows(
    skipped: dict[str, str], not_run: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Rows for the stores that did not run (installs impossible here, engines that failed
    with the store's connector) and the cases not measured (``NOT_RUN`` unless given), each
    with its reason."""
    rows = [
        {"case": "all", "store": name, "skipped": why}
        for name, why in {**NOT_RUNNABLE, **skipped}.items()
    ]
    not_run = NOT_RUN if not_run is None else not_run
    rows += [{"case": label, "store": "all", "skipped": why} for label, why in not_run.items()]
    return rows


def resource_row(
    store: str,
    processes: Sequence[str],
    idle: tuple[int, float],
    after: tuple[int, float],
    stored_tokens: int,
) -> dict[str, Any]:
    """What an operator runs for ``store`` and what its processes hold: RSS when idle and
    after the run, growth per prompt token served through it, CPU seconds over the run."""
    growth = after[0] - idle[0]
    return {
        "case": "resources",
        "store": store,
        "processes": len(processes),
        "process_names": ", ".join(processes),
        "rss_idle_mib": round(idle[0] / 2**20, 1),
        "rss_after_mib": round(after[0] / 2**20, 1),
        "rss_growth_bytes_per_token": round(growth / stored_tokens) if stored_tokens else None,
        "cpu_s": round(after[1] - idle[1], 1),
    }


def text_table(rows: Sequence[dict[str, Any]]) -> str:
    """The measured rows as a plain table for the terminal."""
    lines = [
        f"{'case':<55} {'store':<22} {'TTFT s':>8} {'vs':<18} {'ratio':>6} "
        f"{'target':>6} {'cached':>7} {'same tokens':>11}"
    ]
    for r in rows:
        if "value" not in r:
            continue
        mark = {True: " ok", False: " MISS", None: ""}[r["meets_target"]]
        target = "" if r["target"] is None else f"{r['target']:.1f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(
            f"{r['case']:<55} {r['store']:<22} {r['value']:>8.3f} "
            f"{r['baseline']:<18} {ratio:>6} {target:>6} "
            f"{r['cached_tokens']:>7.0f} {r.get('tokens_identical', ''):>11}{mark}"
            + _traffic_note(r)
        )
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['case']:<55} {r['store']:<22} not run: {r['skipped']}")
        elif r.get("case") == "resources":
            lines.append(
                f"resources: {r['store']:<10} {r['processes']} process(es) "
                f"({r['process_names']}), RSS {r['rss_idle_mib']} -> "
                f"{r['rss_after_mib']} MiB, {r['rss_growth_bytes_per_token']} B per "
                f"served token, {r['cpu_s']} CPU s"
            )
    return "\n".join(lines)


def _traffic_note(r: dict[str, Any]) -> str:
    if "p99_s" not in r:
        return ""
    return f"  p99 {r['p99_s']:.3f} s, {r['hit_share']:.0%} of prompt tokens cached, " + (
        f"{r['tokens_per_s']:.0f} tokens/s"
    )


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The measured rows as a Markdown table (for docs/peers.md)."""
    out = [
        "| case | store | TTFT s (median) | vs no cache | cached tokens | tokens = no cache "
        "| vs best peer (target) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if "value" not in r:
            continue
        if r["baseline"] == NONE:
            out.append(
                f"| {r['case']} | {r['store']} | {r['value']:.3f} | {r['ratio']:.2f}x "
                f"| {r['cached_tokens']:.0f} | {r['tokens_identical']} | |"
            )
        else:
            verdict = {True: "meets", False: "misses", None: ""}[r["meets_target"]]
            out.append(
                f"| {r['case']} | {r['store']} ({r['baseline']}: "
                f"{r['baseline_value']:.3f} s) | {r['value']:.3f} | | "
                f"{r['cached_tokens']:.0f} | | {r['ratio']:.2f}x ({r['target']}x, "
                f"{verdict}) |"
            )
    return "\n".join(out)
