"""``kvstore`` command line. Each subcommand lives in its own module and registers itself in
:data:`COMMANDS` as ``name -> "module:function"``; the function takes ``argparse``'s
subparsers entry and wires itself (lazy: heavy imports happen in the handler).

A handler returns the exit code, or raises :class:`~kvstore.cli_kit.CommandError` for a failure
the user can fix: one line on stderr, exit code 2 (see :mod:`kvstore.cli_kit`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvstore import cli_kit

COMMANDS: dict[str, str] = {
    "hash": "kvstore.cli_hash:add_parser",
    "serve": "server.cli:add_serve_parser",
    "stats": "server.cli_client:add_stats_parser",
    "lookup": "server.cli_client:add_lookup_parser",
    "namespaces": "server.cli_client:add_namespaces_parser",
    "health": "server.cli_client:add_health_parser",
    "explain": "server.cli_explain:add_parser",
}


def build_parser() -> argparse.ArgumentParser:
    parser = cli_kit.Parser(prog="kvstore", description="kvstore KV-cache block service")
    cli_kit.add_version(parser)
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
    args = build_parser().parse_args(argv)
    return cli_kit.run(f"kvstore {args.command}", lambda: int(args.handler(args)))


if __name__ == "__main__":
    sys.exit(main())
