"""The ``kvstore`` program: the client commands of :mod:`kvstore.cli` and ``serve``
(:mod:`server.cli`). It lives here, above both, so that it imports every command it runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvstore import cli_hash
from kvstore.cli import CLIENT_COMMANDS, build_parser, run
from server.cli import add_serve_parser


def parser() -> argparse.ArgumentParser:
    """``kvstore`` with every command: ``hash``, ``serve``, then the client commands."""
    return build_parser((cli_hash.add_parser, add_serve_parser, *CLIENT_COMMANDS))


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
