"""Token ids as every command takes them (``kvstore hash``, ``kvstore explain``,
``kvstore-engine generate``): a JSON list (``[1, 2, 3]``) or ids separated by commas or
whitespace (``1,2,3``, ``1 2 3``, one per line), from ``--tokens``, ``--tokens-file FILE`` or
stdin (``--tokens-file -``). One parser, so that the output of one command (``tokenizer``,
``jq``, ``kvstore-engine generate``'s JSON list) is the input of any other.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstore.cli_kit import CommandError

FORMAT = "a JSON list, or ids separated by commas or whitespace: [1, 2, 3], 1,2,3 or 1 2 3"
_SEPARATORS = re.compile(r"[\s,]+")
_JSON_TYPES = {dict: "object", str: "string", int: "number", float: "number", bool: "boolean"}


def parse_token_ids(text: str) -> list[int]:
    """The token ids written in ``text`` (see :data:`FORMAT`). Raises ``ValueError`` saying
    what is wrong: no ids, JSON that does not parse or is not a list, or the first item that
    is not a non-negative integer."""
    text = text.strip()
    items: list[Any]
    shown: Callable[[Any], str]  # an item as the user wrote it
    if text.startswith(("[", "{")):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc}); expected {FORMAT}") from None
        if not isinstance(doc, list):
            kind = _JSON_TYPES.get(type(doc), "null")
            raise ValueError(f"expected token ids ({FORMAT}), got a JSON {kind}")
        items, shown = doc, json.dumps
    else:
        items = [int(t) if t.isascii() and t.isdigit() else t
                 for t in _SEPARATORS.split(text) if t]
        shown = str
    if not items:
        raise ValueError(f"no token ids; expected {FORMAT}")
    for i, item in enumerate(items):
        # JSON true/false decode to bool and 1.0 to float: refused by name, as negative ids
        if type(item) is not int or item < 0:
            raise ValueError(f"token ids must be non-negative integers; item {i} is "
                             f"{shown(item)}")
    return items


def token_ids_arg(text: str) -> list[int]:
    """:func:`parse_token_ids` as an argparse ``type``: the error names the flag."""
    try:
        return parse_token_ids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_token_args(p: argparse.ArgumentParser, required: bool) -> None:
    """``--tokens IDS`` or ``--tokens-file FILE`` (one of them when ``required``; else
    neither reads stdin)."""
    group = p.add_mutually_exclusive_group(required=required)
    group.add_argument("--tokens", metavar="IDS", help="the prompt's token ids: '[1, 2, 3]', "
                       "'1,2,3' or '1 2 3'" + ("" if required else " (default: read stdin)"))
    group.add_argument("--tokens-file", metavar="FILE", help="a file of token ids: a JSON "
                       "list, or ids separated by commas or whitespace; - reads stdin")


def read_tokens(args: argparse.Namespace) -> list[int]:
    """The token ids of ``--tokens``, ``--tokens-file`` or else stdin (see
    :func:`add_token_args`); a :class:`~kvstore.cli_kit.CommandError` naming where they were
    read when they are none."""
    if args.tokens is not None:
        text, where = args.tokens, "--tokens"
    else:
        stdin = args.tokens_file in (None, "-")
        where = "stdin" if stdin else f"--tokens-file {args.tokens_file}"
        try:
            text = sys.stdin.read() if stdin else \
                Path(args.tokens_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {where}: {exc}") from None
    try:
        return parse_token_ids(text)
    except ValueError as exc:
        raise CommandError(f"{where}: {exc}") from None
