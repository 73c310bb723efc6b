"""``kvstore whatif``: a running server's what-if curve (``GET /v1/whatif``) as a table with a
bar per capacity, today's marked; ``--advise`` adds what each step above today's capacity
would save in prefill (the capacity advisor), ``--reset`` starts the curves again.

Each row is a capacity from a quarter of the tier's to four times it; the bar is the hit rate
the tier would have there on its traffic since start (or the last reset).
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import urlencode

from kvstore.cli_client import _client_args, _read, _request, size, table
from kvstore.protocol.whatif import StepOut, WhatIfOut

BAR = 40  # characters of a hit rate of 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "whatif", help="the hit rate a tier would have at other capacities",
        description="A tier's live miss-ratio curve: the hit rate it would have at 17 "
        "capacities from a quarter of today's to four times it, on its traffic since start, "
        "from a sample of block hashes. A tenant token sees its own namespaces' curve.")
    _client_args(p)
    p.add_argument("--tier", help="host, disk, device or s3 (default: the top tier)")
    p.add_argument("--namespace", help="one namespace (default: every one the token may see)")
    p.add_argument("--policy", help="another eviction policy the server simulates "
                   "(whatif_policies; default: the tier's own)")
    p.add_argument("--advise", action="store_true", help="what each step above today's "
                   "capacity would save: more hits, prefill tokens and seconds an hour")
    p.add_argument("--prefill-tokens-per-s", type=float, metavar="RATE",
                   help="the engine's prefill rate to price misses at (default: the "
                   "server's prefill_tokens_per_s)")
    p.add_argument("--reset", action="store_true", help="start every tier's curves again "
                   "(admin token)")
    p.set_defaults(handler=run)


def _rate(rate: float) -> str:
    return f"{rate:.3f}"


def _bar(rate: float) -> str:
    return "#" * round(max(0.0, min(1.0, rate)) * BAR)


def _saved(step: StepOut | None) -> tuple[str, ...]:
    if step is None:
        return ("", "", "")
    seconds = "-" if step.prefill_s_per_hour is None else f"{step.prefill_s_per_hour:,.1f}"
    return (f"{step.hits_per_hour:,.0f}", f"{step.tokens_per_hour:,.0f}", seconds)


def format_curve(out: WhatIfOut) -> str:
    """The header lines, then one row per point (the bar, today's marked), then the advice."""
    method = "reuse distances" if out.method == "shards" else "miniature simulations"
    scope = "every namespace" if out.namespaces is None else ", ".join(out.namespaces)
    lines = [f"{out.tier} tier, {out.policy} ({method}), {scope}",
             f"sample {out.sample_rate:.2%}: {out.sampled:,} of {out.accesses:,} requests"
             + ("" if out.tracked_keys is None else f", {out.tracked_keys:,} blocks tracked")]
    if out.observed_hit_rate is not None:
        lines.append(f"hit rate today {_rate(out.observed_hit_rate)} measured, "
                     f"{_rate(out.current.hit_rate)} on the curve")
    if out.sampled < 1000:
        lines.append(f"only {out.sampled} sampled requests: read the curve as rough")
    today = out.current.capacity_bytes
    steps = {s.capacity_bytes: s for s in out.advice.steps} if out.advice else {}
    head: tuple[str, ...] = ("capacity", "x", "hit rate")
    if out.advice:
        head += ("+hits/h", "tokens/h", "prefill s/h")
    rows: list[tuple[str, ...]] = [head + ("",)]
    for p in out.points:
        mark = "  <- today" if p.capacity_bytes == today else ""
        row: tuple[str, ...] = (size(p.capacity_bytes), f"{p.capacity_bytes / today:.2f}",
                                _rate(p.hit_rate))
        if out.advice:
            row += _saved(steps.get(p.capacity_bytes))
        rows.append(row + (_bar(p.hit_rate) + mark,))
    lines += ["", table(rows)]
    if out.advice:
        a, step = out.advice, out.advice.next_step
        priced = ("" if step.prefill_s_per_hour is None else
                  f", {step.prefill_s_per_hour:,.1f} prefill seconds an hour at "
                  f"{a.prefill_tokens_per_s:,.0f} tokens/s")
        lines += ["", f"today: {a.requests_per_hour:,.0f} requests an hour "
                  f"(over {a.window_s:,.0f} s)",
                  f"twice the capacity ({size(step.capacity_bytes)}): hit rate "
                  f"{_rate(step.hit_rate)}, {step.hits_per_hour:,.0f} more hits an hour, "
                  f"{step.tokens_per_hour:,.0f} prefill tokens{priced}"]
        if step.prefill_s_per_hour is None:
            lines.append("give --prefill-tokens-per-s (or the server's prefill_tokens_per_s) "
                         "to price it in prefill seconds")
        if a.unpriced:
            lines.append(f"not priced in tokens (their layout names no block_size): "
                         f"{', '.join(a.unpriced)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.reset:
        _request(args, "POST", "/v1/whatif/reset")
        print("what-if curves reset")
        return 0
    params = {k: v for k, v in (("tier", args.tier), ("namespace", args.namespace),
                                ("policy", args.policy)) if v is not None}
    if args.advise:
        params["advise"] = "true"
    if args.prefill_tokens_per_s is not None:
        params["prefill_tokens_per_s"] = str(args.prefill_tokens_per_s)
    path = "/v1/whatif" + (f"?{urlencode(params)}" if params else "")
    doc = _request(args, "GET", path)
    out = _read(args, "/v1/whatif", doc, "a what-if curve", WhatIfOut.model_validate)
    print(json.dumps(doc, indent=2) if args.json else format_curve(out))
    return 0
