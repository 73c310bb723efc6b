"""``kvstore hash`` run as a real process (``python -m kvstore`` and the installed console
script) against the vectors real vLLM 0.32 produced; its input in every token format."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

VECTORS = Path(__file__).resolve().parents[1] / "data" / "vllm_block_hashes.json"
CASES: list[dict[str, Any]] = json.loads(VECTORS.read_text())["cases"]
REPO = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "kvstore"


def _run(
    argv: list[str], stdin: str, *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with ``stdin``; PYTHONHASHSEED is dropped so only ``env`` can set it."""
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    full_env.update(env or {})
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=60, cwd=REPO, env=full_env
    )


def _hash_args(case: dict[str, Any]) -> list[str]:
    args = ["hash", "--algo", case["algo"], "--block-size", str(case["block_size"])]
    if case["seed"] is not None:
        args += ["--seed", case["seed"]]
    if case["cache_salt"] is not None:
        args += ["--cache-salt", case["cache_salt"]]
    return args


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_module_prints_vllm_hashes(case: dict[str, Any]) -> None:
    r = _run([sys.executable, "-m", "kvstore", *_hash_args(case)], json.dumps(case["token_ids"]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == case["block_hashes"]
    assert r.stderr == ""


def test_console_script_prints_vllm_hashes() -> None:
    assert CONSOLE_SCRIPT.exists(), f"console script missing: {CONSOLE_SCRIPT} (pip install -e .)"
    # One case per (algo, seed): the module test above covers the rest of the grid.
    seen: set[tuple[str, str | None]] = set()
    for case in CASES:
        if (case["algo"], case["seed"]) in seen:
            continue
        seen.add((case["algo"], case["seed"]))
        r = _run([str(CONSOLE_SCRIPT), *_hash_args(case)], json.dumps(case["token_ids"]))
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == case["block_hashes"]
    assert len(seen) == 4


def test_environment_seed_is_ignored() -> None:
    # Without --seed the output is vLLM's with PYTHONHASHSEED unset, whatever our env says.
    case = next(c for c in CASES if c["seed"] is None)
    r = _run(
        [sys.executable, "-m", "kvstore", *_hash_args(case)],
        json.dumps(case["token_ids"]),
        env={"PYTHONHASHSEED": "0"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == case["block_hashes"]


def test_partial_block_prints_nothing() -> None:
    r = _run([sys.executable, "-m", "kvstore", "hash", "--block-size", "16"], "[1, 2, 3]")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@pytest.mark.parametrize(
    "stdin, message",
    [
        ("", "stdin: no token ids"),
        (" \n", "stdin: no token ids"),
        ("[1, 2,", "stdin: not valid JSON"),
        ('{"tokens": [1, 2]}', "expected token ids .*, got a JSON object"),
        ("[1, -2, 3]", "item 1 is -2"),
        ("[1, 2.5]", "item 1 is 2.5"),
        ("[1, 2.0]", "item 1 is 2.0"),
        ('[1, "2"]', 'item 1 is "2"'),
        ("[true, 1]", "item 0 is true"),
        ("[[1], 2]", "item 0 is \\[1\\]"),
        ("[null]", "item 0 is null"),
        ("1, -2", "item 1 is -2"),
        ("1 2 x", "item 2 is x"),
        ("1 2.5", "item 1 is 2.5"),
    ],
)
def test_bad_stdin_exits_2(stdin: str, message: str) -> None:
    r = _run([sys.executable, "-m", "kvstore", "hash", "--block-size", "1"], stdin)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.startswith("kvstore hash: ")
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert re.search(message, r.stderr), r.stderr


def test_every_token_format_and_source_hashes_alike(tmp_path: Path) -> None:
    """The format every command takes (a JSON list, or ids separated by commas or
    whitespace), on stdin, in --tokens or in --tokens-file."""
    case = next(c for c in CASES if c["seed"] is None and len(c["block_hashes"]) > 1)
    ids = case["token_ids"]
    (tmp_path / "ids.txt").write_text("\n".join(map(str, ids)) + "\n")
    text = " ".join(map(str, ids))
    runs: list[tuple[list[str], str]] = [
        ([], json.dumps(ids)), ([], ",".join(map(str, ids))), ([], text),
        (["--tokens", ", ".join(map(str, ids))], ""),
        (["--tokens-file", str(tmp_path / "ids.txt")], ""),
        (["--tokens-file", "-"], "\n".join(map(str, ids))),
    ]
    for flags, stdin in runs:
        r = _run([sys.executable, "-m", "kvstore", *_hash_args(case), *flags], stdin)
        assert r.returncode == 0, (flags, r.stderr)
        assert r.stdout.splitlines() == case["block_hashes"], (flags, stdin[:40])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algo", "xxhash_cbor", "--block-size", "4"], "needs a seed"),
        (["--block-size", "0"], "block_size must be a positive int"),
    ],
)
def test_bad_options_exit_2(args: list[str], message: str) -> None:
    r = _run([sys.executable, "-m", "kvstore", "hash", *args], "[1, 2, 3, 4]")
    assert r.returncode == 2
    assert message in r.stderr
    assert r.stdout == ""


def test_xxhash_cbor_with_seed_matches_library() -> None:
    from kvstore.keys import block_hashes

    tokens = list(range(40))
    r = _run(
        [sys.executable, "-m", "kvstore", "hash", "--algo", "xxhash_cbor", "--seed", "9",
         "--block-size", "8", "--cache-salt", "t"],
        json.dumps(tokens),
    )
    assert r.returncode == 0, r.stderr
    expected = [h.hex() for h in block_hashes(tokens, 8, "xxhash_cbor", "9", "t")]
    assert r.stdout.splitlines() == expected
    assert all(len(line) == 32 for line in expected)
