"""Usage errors of the ``kvstore`` client commands, parsed in process: one line naming the help
of the (sub)command the mistake belongs to, with the flag, command or choice that was meant; and
``--url`` without ``http://`` (the programs run whole, ``kvstore serve`` included, are in
tests/server/test_cli_errors.py and test_cli_commands.py)."""

from __future__ import annotations

import pytest

from kvstore.cli import build_parser
from kvstore.cli_kit import http_url
from kvstore.testing import cli


def usage_error(*argv: str) -> str:
    """The one line ``kvstore argv`` refuses with (exit code 2)."""
    return cli.usage_error(build_parser(), argv)


@pytest.mark.parametrize("argv,words", [
    (("stats", "--jsn"), ("kvstore stats: unrecognized arguments: --jsn; did you mean --json?",
                          "(see kvstore stats --help)")),
    (("namespaces", "show", "--jsn=1", "n"), ("did you mean --json?",
                                             "(see kvstore namespaces show --help)")),
    (("stats", "extra"), ("unrecognized arguments: extra (see kvstore stats --help)",)),
    (("--jsn", "stats"), ("kvstore: unrecognized arguments: --jsn (see kvstore --help)",)),
])
def test_an_unknown_flag_names_its_subcommands_help_and_the_flag_meant(
        argv: tuple[str, ...], words: tuple[str, ...]) -> None:
    line = usage_error(*argv)
    for word in words:
        assert word in line, line


def test_a_misspelled_required_flag_is_named_not_reported_missing() -> None:
    line = usage_error("hash", "--block-sise", "16")
    assert "unrecognized arguments: --block-sise; did you mean --block-size?" in line, line
    line = usage_error("explain", "--namespace", "n", "--tokns", "1,2")
    assert "did you mean --tokens?" in line and "kvstore explain --help" in line, line
    # a flag that is really missing is still said so
    line = usage_error("hash")
    assert "required: --block-size (see kvstore hash --help)" in line, line


def test_an_abbreviated_flag_is_no_misspelling() -> None:
    line = usage_error("hash", "--blo", "16", "--algo", "nope")
    assert "argument --algo: invalid choice: 'nope'" in line, line


@pytest.mark.parametrize("argv,words", [
    (("stast",), ("kvstore: argument COMMAND: invalid choice: 'stast'",
                  "did you mean 'stats'?", "(see kvstore --help)")),
    (("namespaces", "lsit"), ("did you mean 'list'?", "(see kvstore namespaces --help)")),
    (("hash", "--block-size", "4", "--algo", "sha265"), ("did you mean 'sha256'?",
                                                          "(see kvstore hash --help)")),
])
def test_a_misspelled_command_or_choice_names_the_one_meant(
        argv: tuple[str, ...], words: tuple[str, ...]) -> None:
    line = usage_error(*argv)
    for word in words:
        assert word in line, line


def test_a_word_close_to_nothing_gets_no_suggestion() -> None:
    line = usage_error("zzzzzz")
    assert "did you mean" not in line and "choose from 'hash'" in line, line


@pytest.mark.parametrize("typed,url", [
    ("localhost:8470", "http://localhost:8470"),
    (" 127.0.0.1:8470/ ", "http://127.0.0.1:8470"),
    ("https://kv.example:443/", "https://kv.example:443"),
    ("http://[::1]:8470", "http://[::1]:8470"),
    ("kv.example", "http://kv.example"),
])
def test_a_url_may_leave_out_http(typed: str, url: str) -> None:
    assert http_url(typed) == url


@pytest.mark.parametrize("typed,why", [
    ("ftp://h:1", "is not an http:// or https:// URL"),
    ("redis://h:6379", "is not an http:// or https:// URL"),
    ("localhost:http", "port that is not a number"),
    ("h:99999", "port that is not a number"),
    (":8470", "names no host"),
])
def test_a_url_that_is_none(typed: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        http_url(typed)


@pytest.mark.parametrize("argv", [
    ("stats",), ("lookup", "ns"), ("namespaces", "list"), ("namespaces", "show", "n"),
    ("health",), ("explain", "--namespace", "n", "--tokens", "1"), ("cluster", "status"),
])
def test_every_command_with_a_url_takes_it_without_http(argv: tuple[str, ...]) -> None:
    args = build_parser().parse_args([*argv, "--url", "localhost:8470"])
    assert args.url == "http://localhost:8470"
    line = usage_error(*argv, "--url", "localhost:x")
    assert "argument --url: 'localhost:x' has a port that is not a number" in line, line
