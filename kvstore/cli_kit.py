"""What every kvstore command line shares (``kvstore``, ``kvstore-engine``, ``kvstore-router``,
``kvstore-planner``): an expected failure is one line on stderr and exit code 2, never a
traceback; a usage error names the help of the (sub)command it belongs to and, for a misspelled
flag, command or choice, the closest right one; ``--help`` shows each flag's meaning and
default; ``--version``; a URL may leave out ``http://``; and a quiet end when stdout is closed
early (``kvstore stats | head``).

A command raises :class:`CommandError` for a failure the user can fix (a bad setting, a port in
use, a server that is not there) and :func:`run` prints it. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib.metadata
import ipaddress
import os
import socket
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn
from urllib.parse import urlsplit

import kvstore


class CommandError(Exception):
    """A failure the user can fix: printed as one line naming the setting and what to do, and
    the command exits with ``code`` (2: change something and run again)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def version() -> str:
    """The installed package's version (the source's when run from a bare checkout)."""
    try:
        return importlib.metadata.version("kvstore")
    except importlib.metadata.PackageNotFoundError:
        return kvstore.__version__


class HelpFormatter(argparse.HelpFormatter):
    """argparse's layout plus ``(default: X)`` after each option that has a default to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (action.option_strings and default not in (None, False, argparse.SUPPRESS)
                and "default:" not in text and action.nargs != 0):
            text += " (default: %(default)s)"
        return text


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known word closest to a misspelled ``word``, or None when none is close."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, known: Iterable[str], quote: bool = False) -> str:
    """``"; did you mean X?"`` for the known word closest to ``word`` (``'X'`` with
    ``quote``), or ``""`` when none is close."""
    close = closest(word, known)
    if close is None:
        return ""
    return f"; did you mean {close!r}?" if quote else f"; did you mean {close}?"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (and exit code 2) naming the help
    of the command they belong to, with a did-you-mean for a misspelled flag, command or
    choice; its help shows defaults, and its subcommand parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Commands)
        self._given: list[str] = []

    def error(self, message: str) -> NoReturn:
        if message.startswith(("the following arguments are required", "one of the arguments")):
            # a misspelled required flag reads as missing: name the misspelling instead
            unknown = [word for word in self._given if self._unknown_flag(word)]
            if unknown:
                message = self._unrecognized(unknown)
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return parsed

    def _flags(self) -> list[str]:
        return [s for action in self._actions for s in action.option_strings]

    def _unknown_flag(self, word: str) -> bool:
        name = word.split("=", 1)[0]
        return name.startswith("--") and len(name) > 2 and not any(
            flag == name or (self.allow_abbrev and flag.startswith(name))
            for flag in self._flags())

    def _unrecognized(self, extras: list[str]) -> str:
        """Arguments this parser does not know, in words, with the flag meant by the first
        misspelled one (``--hots`` or ``--hots=x``: ``--host``)."""
        hint = next((h for word in extras if word.startswith("--")
                     if (h := did_you_mean(word.split("=", 1)[0], self._flags()))), "")
        return f"unrecognized arguments: {' '.join(extras)}{hint}"

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own check, with the closest choice named (a subcommand is a choice too)
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            hint = did_you_mean(str(value), choices, quote=True)
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from "
                                         f"{', '.join(map(repr, choices))}){hint}")


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose unknown arguments are refused by the subcommand's own parser, so that
    the error names ``kvstore serve --help`` rather than ``kvstore --help`` (argparse hands
    them up to the top parser)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        extras = vars(namespace).pop(argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if extras:
            sub = self._name_parser_map[values[0]]
            if isinstance(sub, Parser):
                sub.error(sub._unrecognized(extras))
            vars(namespace)[argparse._UNRECOGNIZED_ARGS_ATTR] = extras


def http_url(text: str) -> str:
    """A server's base URL as typed (``localhost:8470`` or ``http://host:8470/``) made
    whole: ``http://`` when no scheme is given, no trailing slash. Raises ``ValueError``
    for another scheme, no host or a port that is not a number."""
    url = text.strip()
    url = (url if "://" in url else f"http://{url}").rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r} is not an http:// or https:// URL")
    try:
        host, _ = parts.hostname, parts.port
    except ValueError:  # urlsplit reads the port only when asked: not a number, or too big
        raise ValueError(f"{text!r} has a port that is not a number from 0 to 65535") \
            from None
    if not host:
        raise ValueError(f"{text!r} names no host; give host:port, such as 127.0.0.1:8470")
    return url


def url_arg(text: str) -> str:
    """:func:`http_url` as an argparse ``type``: the error names the flag."""
    try:
        return http_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"{parser.prog} {version()}",
                        help="print the version and exit")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server reachable from this machine only (a server
    without a token may bind nowhere else)."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_tcp(host: str, port: int, flag: str) -> list[socket.socket]:
    """Bound (not yet listening) sockets for ``host:port``, one per address the host name
    resolves to, as asyncio's ``create_server`` would make them: a command binds before it
    announces itself or loads anything slow. Raises :class:`CommandError` naming ``flag``
    when the port is taken or the address is not this machine's."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CommandError(f"cannot resolve host {host!r} ({exc.strerror}); set --host to "
                           "an address of this machine") from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
    except OSError as exc:
        for sock in socks:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CommandError(f"port {port} on {host} is in use by another process; stop it "
                               f"or choose another {flag}") from None
        raise CommandError(f"cannot listen on {host}:{port} ({exc.strerror}); check --host "
                           f"and {flag}") from None
    return socks


def run(prog: str, body: Callable[[], int]) -> int:
    """Run a command's body and return its exit code: a :class:`CommandError` becomes one line
    ``prog: message`` on stderr; a reader that closed stdout early (``| head``) ends the
    command quietly with 0, as if the rest had been read."""
    try:
        return body()
    except CommandError as exc:
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        return exc.code
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit: point stdout at
        # /dev/null so that nothing more is written
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
