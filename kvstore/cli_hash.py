"""``kvstore hash``: print the vLLM prefix-cache block hashes of a prompt.

Reads a JSON list of token ids on stdin and prints one lowercase hex hash per full block, in
order. The environment is not consulted: without ``--seed`` the hashes are those of a vLLM
started with ``PYTHONHASHSEED`` unset. Exit status 0 on success, 2 on bad arguments or input
(with a one-line message on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvstore.hash_algos import ALGOS
from kvstore.keys import BlockHasher

_JSON_TYPES = {dict: "object", str: "string", int: "number", float: "number", bool: "boolean"}


def add_parser(subparsers: Any) -> None:
    """Register the ``hash`` subcommand on ``subparsers`` (``argparse`` sub-parsers action)."""
    p = subparsers.add_parser(
        "hash",
        help="print vLLM prefix-cache block hashes of a JSON token list read on stdin",
        description=(
            "Read a JSON list of token ids on stdin and print the chained prefix block hash "
            "of each full block, one hex string per line, exactly as vLLM computes them."
        ),
    )
    p.add_argument("--algo", choices=ALGOS, default="sha256", help="hash algorithm (vLLM's "
                   "--prefix-caching-hash-algo)")
    p.add_argument("--seed", default=None, help="the PYTHONHASHSEED vLLM runs with (omit when "
                   "it is unset; required for xxhash and xxhash_cbor)")
    p.add_argument("--block-size", type=int, required=True, help="tokens per block")
    p.add_argument("--cache-salt", default=None, help="the request's cache_salt")
    p.set_defaults(handler=run)


def _fail(message: str) -> int:
    print(f"kvstore hash: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Hash the token list on stdin with the options in ``args``; return the exit status."""
    try:
        hasher = BlockHasher(args.algo, args.seed, args.block_size)
    except ValueError as e:
        return _fail(str(e))
    try:
        tokens = json.load(sys.stdin)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return _fail(f"stdin is not valid JSON ({e}); expected a list of token ids")
    # JSON true/false decode to bool and 1.0 to float, which hash_blocks refuses too; checking
    # here names the offending item in JSON terms, and refuses negative ids, which it hashes.
    if not isinstance(tokens, list):
        kind = _JSON_TYPES.get(type(tokens), "null")
        return _fail(f"stdin must be a JSON list of token ids, got a JSON {kind}")
    for i, t in enumerate(tokens):
        if type(t) is not int or t < 0:
            return _fail(f"token ids must be non-negative integers; item {i} is {json.dumps(t)}")
    try:
        hashes = hasher.hash_blocks(tokens, cache_salt=args.cache_salt)
    except ValueError as e:
        return _fail(str(e))
    sys.stdout.write("".join(h.hex() + "\n" for h in hashes))
    return 0
