"""``kvstore stats``, ``kvstore lookup``, ``kvstore namespaces list|show|delete`` and
``kvstore health``: commands that ask a running server over REST (``--url``, ``KVSTORE_URL``).

Sizes print human-readable (``--json`` prints the server's document as it is). A server that
refuses is one line with its error code and message: exit code 2 for a 4xx (fix the request),
1 for a 5xx or a server that cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import ByteSize, ValidationError

from kvstore.cli_kit import CommandError, url_arg
from kvstore.namespace import Namespace
from kvstore.problems import problems
from kvstore.protocol.health import StoreHealth
from kvstore.protocol.rest import LookupOut, NamespaceDeleted, NamespaceList, NamespaceShown
from kvstore.protocol.stats import Counts, StoreStats

DEFAULT_URL = "http://127.0.0.1:8470"
T = TypeVar("T")


def default_url(env: Mapping[str, str] = os.environ) -> str:
    """Where a client command looks for the server: ``KVSTORE_URL``, else this machine at the
    port ``kvstore serve`` reads from the same environment (``KVSTORE_PORT``), else 8470."""
    if url := env.get("KVSTORE_URL"):
        return url
    port = env.get("KVSTORE_PORT", "").strip()
    return f"http://127.0.0.1:{port}" if port else DEFAULT_URL


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=default_url(), type=url_arg,
                   help="REST base URL of the server (http:// may be left out: "
                   "localhost:8470); env KVSTORE_URL, else 127.0.0.1 at KVSTORE_PORT")
    p.add_argument("--token", default=os.environ.get("KVSTORE_TOKEN", "").strip() or None,
                   help="bearer token (default: none; env KVSTORE_TOKEN)")
    p.add_argument("--json", action="store_true", help="print the server's JSON as it is")


def _request(args: argparse.Namespace, method: str, path: str, body: Any = None,
             ok: tuple[int, ...] = ()) -> Any:
    """The JSON answer of ``method path``; raises :class:`CommandError` with the server's
    error message when it refuses (statuses in ``ok`` are answers, not refusals)."""
    import httpx

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        r = httpx.request(method, args.url + path, json=body, headers=headers,
                          timeout=60.0)
    except httpx.HTTPError as exc:
        raise CommandError(f"cannot reach {args.url} ({exc}); is kvstore serve running there? "
                           "(--url, KVSTORE_URL)", code=1) from None
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if r.status_code >= 400 and r.status_code not in ok:
        if isinstance(doc, dict) and "message" in doc:
            why = f"{doc.get('error', 'error')}: {doc['message']}"
        else:
            why = r.text.strip() or r.reason_phrase
        raise CommandError(f"server answered {r.status_code} {why}",
                           code=2 if r.status_code < 500 else 1)
    return doc


def _read(args: argparse.Namespace, path: str, doc: Any, what: str,
          parse: Callable[[Any], T]) -> T:
    """``doc``, the answer to ``path``, read by ``parse``: one line and exit code 2 when it is
    not ``what`` a kvstore server answers (``--url`` names another kind of server)."""
    try:
        return parse(doc)
    except ValidationError as exc:
        why = "not JSON" if doc is None else problems(exc)[0].msg
    except (ValueError, KeyError, TypeError) as exc:
        why = "not JSON" if doc is None else f"{type(exc).__name__}: {exc}"
    raise CommandError(f"{args.url}{path} did not answer with {what}: {why}; is --url a "
                       "kvstore server?")


def _path_part(name: str) -> str:
    import httpx

    return httpx.URL(name).raw_path.decode()


def size(n: Any) -> str:
    return ByteSize(int(n)).human_readable() if isinstance(n, int) else "-"


def table(rows: Sequence[tuple[str, ...]]) -> str:
    """Rows (the header first) as left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


# -- stats --------------------------------------------------------------------------------------
def add_stats_parser(sub: Any) -> None:
    p = sub.add_parser("stats", help="print a running server's stats as a table",
                       description="One row for the totals, one per tier, one per namespace. "
                       "logical: the bytes of the blocks (each block once, however many tiers "
                       "hold it); charged: what the tiers charge against their capacity (every "
                       "copy, rounded up to whole slots in the host and device tiers).")
    _client_args(p)
    p.set_defaults(handler=run_stats)


COUNTS = ("queries", "hits", "misses", "hit_rate", "evictions", "promotions", "demotions",
          "corrupt_dropped")


def format_stats(stats: StoreStats) -> str:
    """One row for the totals, one per tier, one per namespace; sizes human-readable."""
    # (row, logical bytes, charged bytes, counters): see docs/store_api.md for the fields
    rows: list[tuple[str, int | None, int | None, Counts]] = [
        ("total", stats.totals.bytes, stats.totals.charged_bytes, stats.totals)]
    rows += [(f"tier {k}", v.logical_bytes, v.bytes, v) for k, v in stats.tiers.items()]
    rows += [(f"ns {k}", v.bytes, None, v) for k, v in stats.namespaces.items()]
    table: list[tuple[str, ...]] = [("", "blocks", "logical", "charged", "capacity", *COUNTS)]
    for name, logical, charged, row in rows:
        table.append((name, str(row.blocks), size(logical), size(charged),
                      size(row.capacity_bytes), *_counts(row)))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
                     for row in table)


def _counts(row: Counts) -> list[str]:
    """The ``COUNTS`` columns of a row."""
    return [str(row.queries), str(row.hits), str(row.misses), f"{row.hit_rate:.3f}",
            *(str(n) for n in (row.evictions, row.promotions, row.demotions,
                               row.corrupt_dropped))]


def run_stats(args: argparse.Namespace) -> int:
    doc = _request(args, "GET", "/v1/stats")
    stats = _read(args, "/v1/stats", doc, "the server's stats", StoreStats.model_validate)
    print(json.dumps(doc, indent=2) if args.json else format_stats(stats))
    return 0


# -- lookup -------------------------------------------------------------------------------------
def add_lookup_parser(sub: Any) -> None:
    p = sub.add_parser("lookup", help="longest cached prefix of a chain of block hashes")
    _client_args(p)
    p.add_argument("namespace", help="the namespace the blocks were stored under")
    p.add_argument("hashes", nargs="*", help="block hashes as hex (or '-' to read stdin)")
    p.set_defaults(handler=run_lookup)


def run_lookup(args: argparse.Namespace) -> int:
    import sys

    hashes = list(args.hashes)
    if hashes == ["-"]:
        hashes = sys.stdin.read().split()
    doc = _request(args, "POST", "/v1/lookup", {"namespace": args.namespace,
                                                  "block_hashes": hashes})
    found = _read(args, "/v1/lookup", doc, "a lookup's answer", LookupOut.model_validate)
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"prefix_blocks {found.prefix_blocks} of {len(hashes)}")
        for h, tier in zip(hashes, found.tiers, strict=False):
            print(f"  {h}  {tier}")
    return 0


# -- namespaces ---------------------------------------------------------------------------------
NAME_HELP = "namespace name (with the admin token, a tenant's is TENANT~NAME)"


def add_namespaces_parser(sub: Any) -> None:
    p = sub.add_parser("namespaces", help="list, show or delete a running server's namespaces")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="the namespaces this token may see")
    _client_args(listing)
    show = verbs.add_parser("show", help="one namespace: its definition and its counters")
    _client_args(show)
    show.add_argument("name", help=NAME_HELP)
    delete = verbs.add_parser("delete", help="forget a namespace and remove its blocks from "
                                             "every tier")
    _client_args(delete)
    delete.add_argument("name", help=NAME_HELP)
    p.set_defaults(handler=run_namespaces)


def _shown(doc: Any) -> tuple[Namespace, Counts]:
    """``GET /v1/namespaces/{name}``'s answer: the namespace and its ``stats``."""
    shown = NamespaceShown.model_validate(doc)
    return shown.namespace(), shown.stats


def _show(ns: Namespace, stats: Counts) -> str:
    """A namespace and its counters as rows."""
    rows = [("name", ns.name), ("tenant", ns.tenant or "-"),
            ("block_bytes", f"{ns.block_bytes} ({size(ns.block_bytes)})"),
            ("hash_algo", ns.hash_algo), ("hash_seed", ns.hash_seed or "-"),
            ("layout", json.dumps(ns.layout.to_dict(), sort_keys=True)),
            ("blocks", str(stats.blocks)), ("logical", size(stats.bytes)),
            *zip(COUNTS, _counts(stats), strict=True)]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def format_namespaces(spaces: list[Namespace]) -> str:
    """One row per namespace under a header: its tenant, block bytes and what its blocks'
    hashes depend on (block size in tokens, hash algorithm and seed)."""
    rows = [("name", "tenant", "block_bytes", "block_size", "hash_algo", "hash_seed")]
    rows += [(ns.name, ns.tenant or "-", size(ns.block_bytes),
              str(ns.layout.block_size or "-"),
              ns.hash_algo, ns.hash_seed or "-") for ns in spaces]
    return table(rows) + ("" if spaces else "\n(no namespaces)")


def run_namespaces(args: argparse.Namespace) -> int:
    if args.verb == "list":
        path = "/v1/namespaces"
        doc = _request(args, "GET", path)
        out = format_namespaces(_read(args, path, doc, "a list of namespaces", lambda d: [
            ns.namespace() for ns in NamespaceList.model_validate(d).namespaces]))
    elif args.verb == "show":
        path = f"/v1/namespaces/{_path_part(args.name)}"
        doc = _request(args, "GET", path)
        out = _show(*_read(args, path, doc, "a namespace", _shown))
    else:
        path = f"/v1/namespaces/{_path_part(args.name)}"
        doc = _request(args, "DELETE", path)
        gone = _read(args, path, doc, "a deleted namespace", NamespaceDeleted.model_validate)
        out = f"deleted namespace {gone.name} ({gone.blocks} blocks)"
    print(json.dumps(doc) if args.json else out)
    return 0


# -- health -------------------------------------------------------------------------------------
def add_health_parser(sub: Any) -> None:
    p = sub.add_parser("health", help="whether a running server can serve, tier by tier "
                       "(exit code 0 healthy, 1 not)")
    _client_args(p)
    p.set_defaults(handler=run_health)


def run_health(args: argparse.Namespace) -> int:
    doc = _request(args, "GET", "/healthz", ok=(503,))
    health = _read(args, "/healthz", doc, "the server's health", StoreHealth.model_validate)
    if args.json:
        print(json.dumps(doc))
    else:
        state = "ok" if health.ok else "NOT OK"
        extra = " (shutting down)" if health.closing else ""
        print(f"{args.url}: {state}{extra}")
        if health.error:
            print(f"  error: {health.error}")
        if "tiers" not in health.model_fields_set:  # shown only to a token
            print("  (each tier's health needs a token: --token or KVSTORE_TOKEN)")
        for name, tier in health.tiers.items():
            facts = "  ".join(f"{k} {v}" for k, v in (tier.model_extra or {}).items())
            print(f"  tier {name}: {'ok' if tier.ok else 'NOT OK'}  {facts}".rstrip())
    return 0 if health.ok else 1
