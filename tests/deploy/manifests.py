"""What the deploy tests read: the files under ``deploy/`` as documents, and the command-line
parsers of the programs they start (each file's commands are checked against the program's own
parser, not a copy of its flags)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DATA_DIR = "/var/lib/kvstore"  # the image's data dir (deploy/Dockerfile)
CONNECTOR = {"kv_connector": "KVStoreConnector", "kv_connector_module_path": "connectors.vllm",
             "kv_role": "kv_both"}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def parse(program: str, argv: list[str]) -> argparse.Namespace:
    """``argv`` as ``program`` (kvstore, kvstore-engine, kvstore-router) reads it; a flag it
    does not know fails the test. ``argv`` may start with the program's name."""
    if argv[:1] == [program]:
        argv = argv[1:]
    if program == "kvstore":
        from server.main import parser
        p = parser()
    elif program == "kvstore-engine":
        from engines.cli import build_parser as engine_parser
        p = engine_parser()
    elif program == "kvstore-router":
        from engines.router.cli import build_parser as router_parser
        p = router_parser()
    else:
        raise AssertionError(f"no parser for {program}")
    try:
        return p.parse_args(argv)
    except SystemExit:
        raise AssertionError(f"{program} refuses {shlex.join(argv)}") from None


def flag(argv: list[str], name: str) -> str:
    """The value after ``name`` in ``argv``."""
    assert name in argv, f"{name} missing from {shlex.join(argv)}"
    return argv[argv.index(name) + 1]
