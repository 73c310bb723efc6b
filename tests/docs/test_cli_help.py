"""The command lines document themselves: ``--help`` of every command shows each
flag's meaning and default (``kvstore serve``'s generated from the settings' descriptions), and
``kvstore``, ``kvstore-engine`` and ``kvstore-router`` answer ``--version``."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
from collections.abc import Iterator

import pytest

from engines.cli import build_parser as engine_parser
from engines.router.cli import build_parser as router_parser
from engines.simulator.cli import build_parser as simulate_parser
from kvstore.testing.proc import ROOT, console_script
from server.cli import flag_of, shown_default
from server.main import parser as kvstore_parser
from server.settings import ServerSettings


def flat(text: str) -> str:
    return " ".join(text.split())


def test_serve_help_shows_every_setting_with_its_description_and_default() -> None:
    run = subprocess.run([*console_script("kvstore", "server.main"), "serve", "--help"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "COLUMNS": "100"})
    assert run.returncode == 0, run.stderr
    text = flat(run.stdout)
    for name, info in ServerSettings.model_fields.items():
        assert info.description, f"{name} has no description"
        assert flag_of(name) in text, name
        assert flat(info.description) in text, name
        assert f"(default: {shown_default(info)}; env KVSTORE_{name.upper()})" in text, name
    # defaults as an operator reads them: sizes human-readable, switches on/off
    assert "--host-capacity SIZE" in text and "(default: 1.0GiB; env KVSTORE_HOST_CAPACITY)" in text
    assert "(default: on; env KVSTORE_ENABLE_SHM)" in text
    assert "--log-level {critical,error,warning,info,debug}" in text


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from subcommands(child)


@pytest.mark.parametrize("make", [kvstore_parser, engine_parser, router_parser,
                                  simulate_parser])
def test_every_flag_says_what_it_is_and_its_default(make: object) -> None:
    for prog, parser in subcommands(make()):  # type: ignore[operator]
        if prog == "kvstore serve":
            continue  # generated from the settings: the test above
        text = flat(parser.format_help())
        for action in parser._actions:
            if not action.option_strings or action.dest in ("help", "version"):
                continue
            assert action.help, f"{prog} {action.option_strings[0]} has no help"
            default = action.default
            if default not in (None, False, "") and action.nargs != 0:
                assert f"(default: {default})" in text, f"{prog} {action.option_strings[0]}"


@pytest.mark.parametrize("name,module", [("kvstore", "server.main"),
                                         ("kvstore-engine", "engines.cli"),
                                         ("kvstore-router", "engines.router.cli")])
def test_version(name: str, module: str) -> None:
    run = subprocess.run([*console_script(name, module), "--version"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"{name} {importlib.metadata.version('kvstore')}"
