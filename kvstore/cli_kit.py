"""What every kvstore command line shares (``kvstore``, ``kvstore-engine``, ``kvstore-router``):
an expected failure is one line on stderr and exit code 2, never a traceback; ``--help`` shows
each flag's meaning and default; ``--version``; and a quiet end when stdout is closed early
(``kvstore stats | head``).

A command raises :class:`CommandError` for a failure the user can fix (a bad setting, a port in
use, a server that is not there) and :func:`run` prints it. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib.metadata
import ipaddress
import os
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

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


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (and exit code 2) and whose help
    shows defaults; its subcommand parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


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
