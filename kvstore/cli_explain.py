"""``kvstore explain``: why a prompt hits or misses in a namespace of a running server, block by
block (``POST /v1/explain``), printed as a table of runs of blocks with the same fate, then
the server's hints.

Token ids come from ``--tokens 1,2,3`` or ``--tokens-file F`` (``-`` reads stdin), in the
format every command takes (:mod:`kvstore.cli_tokens`: a JSON list, or ids separated by commas
or whitespace). A refusal is one line and exit code 2, as for the other client commands
(:mod:`kvstore.cli_client`).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any, NamedTuple

from kvstore.cli_client import _client_args, _read, _request
from kvstore.cli_kit import CommandError
from kvstore.cli_tokens import add_token_args, read_tokens
from kvstore.protocol.explain import ExplainedBlock, ExplainOut


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "explain", help="why a prompt hits or misses in a namespace, block by block",
        description="Hash the prompt's token ids as the engine would with the namespace's "
        "recipe (hash algorithm, PYTHONHASHSEED, block size) and show, for runs of blocks: "
        "stored (in which tiers), evicted (when, from which tier, why), never seen, or stored "
        "under another namespace's recipe (which of algorithm, seed and block size differs).")
    _client_args(p)
    p.add_argument("--namespace", required=True, help="the namespace the engine uses")
    add_token_args(p, required=True)
    p.add_argument("--salt", help="the request's cache_salt")
    p.add_argument("--lora", metavar="NAME", help="the LoRA adapter's name (with --lora-path)")
    p.add_argument("--lora-path", metavar="PATH", help="the LoRA adapter's path: vLLM hashes "
                   "its name and path into every block")
    p.set_defaults(handler=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    if (args.lora is None) != (args.lora_path is None):
        raise CommandError("--lora and --lora-path go together: vLLM hashes the adapter's "
                           "name and path")
    body = {"namespace": args.namespace, "tokens": read_tokens(args), "cache_salt": args.salt,
            "lora_name": args.lora, "lora_path": args.lora_path}
    answer = _explanation(args, body)
    while answer.next_offset is not None:  # the server answers a page of block rows
        page = _explanation(args, {**body, "offset": answer.next_offset})
        answer = answer.model_copy(update={"blocks": answer.blocks + page.blocks,
                                           "next_offset": page.next_offset})
    if args.json:
        print(json.dumps(answer.model_dump(mode="json"), indent=2))
        return 0
    print(format_explain(answer))
    return 0


def _explanation(args: argparse.Namespace, body: dict[str, object]) -> ExplainOut:
    """One page of ``POST /v1/explain``; a :class:`CommandError` when it is none."""
    doc = _request(args, "POST", "/v1/explain", body)
    return _read(args, "/v1/explain", doc, "an explanation", ExplainOut.model_validate)


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _where(block: ExplainedBlock) -> str:
    """The fate of a block in words, the same for every block of a run (a ghost's time aside)."""
    others = ", ".join(f"{o.namespace} ({', '.join(o.differs)} differs)" for o in block.other)
    if block.status == "stored":
        return ", ".join(block.tiers)
    if block.status == "evicted" and block.ghost is not None:
        ghost = block.ghost
        return f"{ghost.why} from {ghost.tier}" + (f"; tokens in {others}" if others else "")
    return others or "-"


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


class _Run(NamedTuple):
    """Consecutive blocks with the same status and place."""

    first: ExplainedBlock
    last: ExplainedBlock
    where: str
    at: float | None  # the latest ghost time of the run


def format_explain(doc: ExplainOut) -> str:
    """A heading (recipe, prefix hit, counts), one row per run of consecutive blocks with the
    same status and place, then the hints."""
    r = doc.recipe
    seed = "unset" if r.hash_seed is None else repr(r.hash_seed)
    n = sum(doc.counts.values())
    miss = "none" if doc.first_miss is None else f"block {doc.first_miss}"
    lines = [
        f"namespace {doc.namespace}: {r.hash_algo}, PYTHONHASHSEED {seed}, "
        f"block size {r.block_size}",
        f"{doc.tokens} tokens: {n} full blocks + {doc.tail_tokens} tail tokens; prefix "
        f"hit {doc.prefix_blocks} blocks ({doc.prefix_tokens} tokens); first miss: {miss}",
        ", ".join(f"{status} {count}" for status, count in doc.counts.items()),
    ]
    runs: list[_Run] = []
    for b in doc.blocks:
        where, at = _where(b), b.ghost.at if b.ghost is not None else None
        if runs and runs[-1].first.status == b.status and runs[-1].where == where:
            prev = runs[-1].at
            runs[-1] = runs[-1]._replace(last=b, at=prev if at is None else max(prev or at, at))
        else:
            runs.append(_Run(b, b, where, at))
    table = [("blocks", "tokens", "status", "where")]
    for run in runs:
        table.append((_span(run.first.index, run.last.index),
                      _span(run.first.start, run.last.end - 1), run.first.status,
                      f"{run.where}, last at {_when(run.at)}" if run.at is not None
                      else run.where))
    if runs:
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        lines.append("")
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True))
                  + "  " + row[3] for row in table]
    if doc.hints:
        lines += ["", "hints:"] + [f"  - {hint}" for hint in doc.hints]
    return "\n".join(lines)
