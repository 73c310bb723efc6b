"""Checks for commands that must refuse a bad start: one line on stderr, exit code 2, no
traceback; the line a parser refuses a command line with; and a loopback port some other process
already listens on."""

from __future__ import annotations

import argparse
import io
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stderr


def assert_one_line(done: subprocess.CompletedProcess[str], *words: str,
                    never: tuple[str, ...] = ("Traceback",)) -> str:
    """Assert ``done`` exited 2 with exactly one non-blank stderr line containing every one of
    ``words`` and none of ``never``; return that line."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    for bad in never:
        assert bad not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def usage_error(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str:
    """The one line ``parser`` refuses ``argv`` with; asserts it exits with code 2."""
    err = io.StringIO()
    with redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 2, (exc.code, err.getvalue())
        else:
            raise AssertionError(f"{parser.prog} accepted {list(argv)}")
    lines = err.getvalue().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@contextmanager
def port_in_use() -> Iterator[int]:
    """A loopback port a socket of this process listens on until the block ends."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]
