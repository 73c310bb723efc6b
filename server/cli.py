"""``kvstore serve``, ``kvstore stats``, ``kvstore lookup`` and ``kvstore namespaces``.

``serve`` has one flag per :class:`~server.settings.ServerSettings` field (``--host-capacity``
for ``host_capacity``); a flag left out falls back to ``KVSTORE_*`` and then the YAML file.
``stats`` and ``lookup`` talk to a running server over REST (``--url``, ``KVSTORE_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8470"


_VISIBLE = ("VISIBLE IN THE PROCESS LIST (ps) to every local user: prefer {file} or the "
            "environment. ")
_HELP = {
    "token": "admin bearer token. " + _VISIBLE.format(file="--token-file"),
    "token_file": "file holding the admin token (mode 0600) ",
    "tenant_tokens_file": "file holding the JSON map tenant -> token (mode 0600) ",
    "rest_body_budget_bytes": "REST request body bytes in flight, all requests together; "
                              "over it: 503 ",
    "rest_header_timeout_s": "seconds a REST request's headers may take; then 408 and "
                             "close ",
    "rest_max_pending_connections": "REST connections still sending headers; over it the "
                                    "oldest is closed ",
    "lease_s": "seconds a pin or reservation lasts when the client names no lease ",
    "max_lease_s": "longest lease, seconds: every pin, grant (shm_lookup), read or "
                   "reservation asking for longer gets this ",
    "max_pinned_bytes_per_tenant": "bytes one tenant (--tenant-tokens) may hold pinned at "
                                   "once; past it pins fail with pin_quota. 0: a quarter of "
                                   "the top tier ",
    "grant_grace_s": "seconds a client's grants (shm_lookup pins) outlive its last "
                     "connection, for workers still copying them ",
}


def _settings_flags(parser: argparse.ArgumentParser) -> None:
    from server.settings import ServerSettings

    for name, info in ServerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = info.description or _HELP.get(name, "") + f"(KVSTORE_{name.upper()})"
        if info.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        elif name == "tenant_tokens":
            parser.add_argument(flag, dest=name, default=None, type=json.loads,
                                help='JSON map tenant -> token, e.g. \'{"a": "tok"}\'. '
                                     + _VISIBLE.format(file="--tenant-tokens-file"))
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the kvstore server (REST + data plane)")
    p.add_argument("--config", default=None, help="YAML settings file (KVSTORE_CONFIG)")
    _settings_flags(p)
    p.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from server.preflight import StartupError
    from server.runtime import loop_factory, serve
    from server.settings import ServerSettings, load_settings

    flags = {k: getattr(args, k) for k in ServerSettings.model_fields if hasattr(args, k)}
    try:
        settings = load_settings(args.config, **flags)
    except (ValidationError, FileNotFoundError) as exc:
        print(f"kvstore serve: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        try:
            return runner.run(serve(settings))
        except StartupError as exc:
            print(f"kvstore serve: {exc}", file=sys.stderr)
            return 2


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("KVSTORE_URL", DEFAULT_URL),
                   help="REST base URL (KVSTORE_URL)")
    p.add_argument("--token", default=os.environ.get("KVSTORE_TOKEN"),
                   help="bearer token (KVSTORE_TOKEN)")
    p.add_argument("--json", action="store_true", help="print raw JSON")


def _rest(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        r = httpx.request(method, args.url.rstrip("/") + path, json=body, headers=headers,
                          timeout=10.0)
    except httpx.HTTPError as exc:
        raise SystemExit(f"kvstore: cannot reach {args.url}: {exc}") from None
    if r.status_code >= 400:
        raise SystemExit(f"kvstore: {r.status_code} {r.text}")
    return r.json()


def add_stats_parser(sub: Any) -> None:
    p = sub.add_parser("stats", help="print a running server's stats as a table")
    _client_args(p)
    p.set_defaults(handler=run_stats)


COLUMNS = ("blocks", "bytes", "capacity_bytes", "queries", "hits", "misses", "hit_rate",
           "evictions", "promotions", "demotions", "corrupt_dropped")


def format_stats(doc: dict[str, Any]) -> str:
    """One row for the totals, one per tier, one per namespace."""
    rows = [("total", doc["totals"])]
    rows += [(f"tier {k}", v) for k, v in doc["tiers"].items()]
    rows += [(f"ns {k}", v) for k, v in doc["namespaces"].items()]
    table: list[tuple[str, ...]] = [("", *COLUMNS)]
    for name, values in rows:
        cells = [f"{values.get(c, 0):.3f}" if c == "hit_rate" else str(values.get(c, 0))
                 for c in COLUMNS]
        table.append((name, *cells))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
                     for row in table)


def run_stats(args: argparse.Namespace) -> int:
    doc = _rest(args, "GET", "/v1/stats")
    print(json.dumps(doc, indent=2) if args.json else format_stats(doc))
    return 0


def add_lookup_parser(sub: Any) -> None:
    p = sub.add_parser("lookup", help="longest cached prefix of a chain of block hashes")
    _client_args(p)
    p.add_argument("namespace")
    p.add_argument("hashes", nargs="*", help="block hashes as hex (or '-' to read stdin)")
    p.set_defaults(handler=run_lookup)


def run_lookup(args: argparse.Namespace) -> int:
    hashes = list(args.hashes)
    if hashes == ["-"]:
        hashes = sys.stdin.read().split()
    doc = _rest(args, "POST", "/v1/lookup", {"namespace": args.namespace,
                                               "block_hashes": hashes})
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"prefix_blocks {doc['prefix_blocks']} of {len(hashes)}")
        for h, tier in zip(hashes, doc["tiers"], strict=False):
            print(f"  {h}  {tier}")
    return 0


def add_namespaces_parser(sub: Any) -> None:
    p = sub.add_parser("namespaces", help="list or delete a running server's namespaces")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="the namespaces this token may see")
    _client_args(listing)
    delete = verbs.add_parser("delete", help="forget a namespace and remove its blocks from "
                                             "every tier")
    _client_args(delete)
    delete.add_argument("name")
    p.set_defaults(handler=run_namespaces)


def run_namespaces(args: argparse.Namespace) -> int:
    """One line and exit code 2 when the server refuses (unknown name, another tenant's)."""
    import httpx

    if args.verb == "list":
        method, path = "GET", "/v1/namespaces"
    else:
        method, path = "DELETE", f"/v1/namespaces/{httpx.URL(args.name).raw_path.decode()}"
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        r = httpx.request(method, args.url.rstrip("/") + path, headers=headers, timeout=60.0)
    except httpx.HTTPError as exc:
        print(f"kvstore namespaces: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if r.status_code >= 400:
        try:
            message = str(r.json().get("message", r.text))
        except ValueError:
            message = r.text
        print(f"kvstore namespaces {args.verb}: {r.status_code} {message}", file=sys.stderr)
        return 2 if r.status_code < 500 else 1
    doc = r.json()
    if args.json:
        print(json.dumps(doc))
    elif args.verb == "list":
        for ns in doc["namespaces"]:
            print(f"{ns['name']}  block_bytes {ns['block_bytes']}  tenant {ns['tenant'] or '-'}")
    else:
        print(f"deleted namespace {doc['name']} ({doc['blocks']} blocks)")
    return 0
