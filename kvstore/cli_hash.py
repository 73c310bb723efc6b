"""``kvstore hash``: print the vLLM prefix-cache block hashes of a prompt.

Reads the prompt's token ids from ``--tokens``, ``--tokens-file`` or stdin, in the format every
command takes (:mod:`kvstore.cli_tokens`: a JSON list, or ids separated by commas or
whitespace), and prints one lowercase hex hash per full block, in order. The environment is not
consulted: without ``--seed`` the hashes are those of a vLLM started with ``PYTHONHASHSEED``
unset. Exit status 0 on success, 2 on bad arguments or input (with a one-line message on
stderr).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvstore.cli_kit import CommandError
from kvstore.cli_tokens import add_token_args, read_tokens
from kvstore.hash_algos import ALGOS
from kvstore.keys import BlockHasher


def add_parser(subparsers: Any) -> None:
    """Register the ``hash`` subcommand on ``subparsers`` (``argparse`` sub-parsers action)."""
    p = subparsers.add_parser(
        "hash",
        help="print vLLM prefix-cache block hashes of a prompt's token ids",
        description=(
            "Print the chained prefix block hash of each full block of a prompt, one hex "
            "string per line, exactly as vLLM computes them. The token ids are a JSON list or "
            "ids separated by commas or whitespace, from --tokens, --tokens-file or stdin."
        ),
    )
    p.add_argument("--algo", choices=ALGOS, default="sha256", help="hash algorithm (vLLM's "
                   "--prefix-caching-hash-algo)")
    p.add_argument("--seed", default=None, help="the PYTHONHASHSEED vLLM runs with (omit when "
                   "it is unset; required for xxhash and xxhash_cbor)")
    p.add_argument("--block-size", type=int, required=True, help="tokens per block")
    p.add_argument("--cache-salt", default=None, help="the request's cache_salt")
    add_token_args(p, required=False)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Hash the token ids with the options in ``args``; return the exit status."""
    try:
        hasher = BlockHasher(args.algo, args.seed, args.block_size)
    except ValueError as e:
        raise CommandError(str(e)) from None
    tokens = read_tokens(args)
    try:
        hashes = hasher.hash_blocks(tokens, cache_salt=args.cache_salt)
    except ValueError as e:
        raise CommandError(str(e)) from None
    sys.stdout.write("".join(h.hex() + "\n" for h in hashes))
    return 0
