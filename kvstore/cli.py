"""``kvstore`` command line. Each subcommand lives in its own module and registers itself in
:data:`COMMANDS` as ``name -> "module:function"``; the function takes ``argparse``'s
subparsers entry and wires itself (lazy: heavy imports happen in the handler)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, str] = {
    "hash": "kvstore.cli_hash:add_parser",
    "serve": "server.cli:add_serve_parser",
    "stats": "server.cli:add_stats_parser",
    "lookup": "server.cli:add_lookup_parser",
    "namespaces": "server.cli:add_namespaces_parser",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvstore", description="kvstore KV-cache block service")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for target in COMMANDS.values():
        module, _, attr = target.partition(":")
        try:
            add = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue  # a part not installed or not built yet: its command is absent
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rc: int = args.handler(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
