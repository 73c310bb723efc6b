"""The ``kvstore`` command line's client side: the commands that talk to a running server over
REST or compute locally (``hash``, ``stats``, ``lookup``, ``namespaces``, ``health``,
``explain``, ``cluster``). Each lives in its own module and has an ``add_*`` function that
wires it onto ``argparse``'s subparsers (heavy imports happen in its handler). The
``kvstore`` program adds ``serve`` to them (:mod:`server.main`, which can import both sides).

A handler returns the exit code, or raises :class:`~kvstore.cli_kit.CommandError` for a failure
the user can fix: one line on stderr, exit code 2 (see :mod:`kvstore.cli_kit`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from kvstore import cli_client, cli_cluster, cli_explain, cli_hash, cli_kit, cli_whatif

AddCommand = Callable[[Any], None]  # wires one subcommand onto argparse's subparsers

CLIENT_COMMANDS: tuple[AddCommand, ...] = (
    cli_client.add_stats_parser, cli_client.add_lookup_parser,
    cli_client.add_namespaces_parser, cli_client.add_health_parser, cli_explain.add_parser,
    cli_whatif.add_parser, cli_cluster.add_parser,
)


def build_parser(commands: Sequence[AddCommand] = (cli_hash.add_parser, *CLIENT_COMMANDS)
                 ) -> argparse.ArgumentParser:
    """The ``kvstore`` parser with ``commands``, in that order (help lists them so)."""
    parser = cli_kit.Parser(prog="kvstore", description="kvstore KV-cache block service")
    cli_kit.add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in commands:
        add(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command's handler (see :mod:`kvstore.cli_kit`)."""
    args = parser.parse_args(argv)
    return cli_kit.run(f"kvstore {args.command}", lambda: int(args.handler(args)))
