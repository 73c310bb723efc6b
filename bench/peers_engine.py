"""One vLLM CPU engine per process for the peers bench, driven over stdin and stdout, that times
the first token itself.

``python bench/peers_engine.py SPEC`` builds the engine with ``bench_vllm``'s settings (block 32,
float32, eager, seed 0) and the connector the spec names, prints ``@@READY``, then answers each
``{"prompt", "max_tokens", "reset"}`` line with ``@@RESULT {"ttft", "seconds", "tokens",
"cached"}``. The request goes through ``LLMEngine.add_request`` and ``step()`` so that the time
to the first token is measured while the same request goes on to generate ``max_tokens`` greedy
tokens, which the bench compares across stores.

Spec keys: ``model``, ``connector`` (the ``kv_transfer_config``; none: no connector),
``engine_args`` (more ``LLM`` keyword arguments) and ``llvmlite_fix``: LMCache imports numba,
after which vLLM's ``vars()`` on llvmlite's ``ffi.lib`` fails at start (``'_lib_fn_wrapper'
object has no attribute 'get'``); an empty ``__dict__`` entry in its function table avoids it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from peers_concurrent import serve_trace

from kvstore.testing.proc import ROOT, die_with_parent

BLOCK = 32  # tokens per KV block, as bench_vllm.BLOCK
MAX_NUM_SEQS = 4  # requests an engine runs at once
KV_CACHE_BYTES = 256 << 20  # each engine's own paged KV (several 2k-token prompts)
READY_S = 600.0  # a cold start of several engines at once on two shared cores
ANSWER_S = 600.0
RESET_S = 60.0  # how long a reset may wait for a connector's saves to finish
RANK = re.compile(r"^\[rank\d+\]: ")  # vLLM's prefix on a worker's log lines
RAISED = re.compile(r"^[\w.]*(Error|Exception)\b.*: ")  # a traceback's last line


def _llvmlite_fix() -> None:
    from llvmlite.binding import ffi

    ffi.lib._fntab["__dict__"] = {}


def build(spec: dict[str, Any]) -> Any:
    if spec.get("llvmlite_fix"):
        _llvmlite_fix()
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "model": spec["model"],
        "dtype": "float32",
        "block_size": BLOCK,
        "max_model_len": 8192,
        "max_num_seqs": MAX_NUM_SEQS,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "seed": 0,
    }
    kwargs.update(spec.get("engine_args", {}))
    if spec.get("connector"):
        kwargs["kv_transfer_config"] = spec["connector"]
    return LLM(**kwargs)


def reset(llm: Any) -> None:
    """Forget the engine's own cached KV, so the next prompt is served as by a fresh engine.

    A connector that saves asynchronously (LMCache, Mooncake) keeps a finished request's
    blocks until an engine step collects its finished saves, and vLLM refuses the reset while
    any block is held; an idle engine takes no steps by itself, so they are taken here."""
    deadline = time.monotonic() + RESET_S
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            raise RuntimeError(f"reset_prefix_cache refused for {RESET_S} s: blocks still held")
        llm.llm_engine.step()  # runs while the scheduler holds finished requests' blocks
        time.sleep(0.01)


def serve(llm: Any, cmd: dict[str, Any], request_id: str) -> dict[str, Any]:
    """One request to completion: seconds to its first token and in all, its tokens, and the
    prompt tokens it did not compute (vLLM's own cache plus the connector's)."""
    from vllm import SamplingParams

    if cmd.get("reset"):
        reset(llm)
    sp = SamplingParams(
        max_tokens=cmd["max_tokens"], temperature=0.0, detokenize=False, ignore_eos=True
    )
    engine = llm.llm_engine
    start = time.perf_counter()
    engine.add_request(request_id, {"prompt_token_ids": cmd["prompt"]}, sp)
    ttft, final = None, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if ttft is None and out.outputs and out.outputs[0].token_ids:
                ttft = time.perf_counter() - start
            if out.finished:
                final = out
    seconds = time.perf_counter() - start
    if final is None or ttft is None:
        raise RuntimeError("the engine finished without an output")
    return {
        "ttft": ttft,
        "seconds": seconds,
        "tokens": list(final.outputs[0].token_ids),
        "cached": final.num_cached_tokens or 0,
    }


def worker(spec: dict[str, Any]) -> None:
    llm = build(spec)
    print("@@READY", flush=True)
    for i, line in enumerate(sys.stdin):
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            break
        if cmd.get("op") == "trace":
            if cmd.get("reset"):
                reset(llm)
            out = serve_trace(llm, cmd, f"peers-{i}")
        else:
            out = serve(llm, cmd, f"peers-{i}")
        print("@@RESULT " + json.dumps(out), flush=True)


class EngineProc:
    """Driver of one :func:`worker` process. Its output (vLLM's log and the answers) is kept in
    memory and appended to ``log_path``; the process dies with the bench (``PR_SET_PDEATHSIG``)
    even if the bench is killed outright."""

    def __init__(
        self, name: str, spec: dict[str, Any], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        full_env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", **(env or {}))
        paths = [*(env or {}).get("PYTHONPATH", "").split(os.pathsep), str(ROOT)]
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        self._log = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, __file__, json.dumps(spec)],
            cwd=ROOT,
            env=full_env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self.ready = False
        self.tail: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self.tail = [*self.tail[-60:], line.rstrip()]
            if line.startswith("@@"):
                self._lines.put(line.strip())
        self._lines.put("@@EOF")

    def _answer(self, timeout: float) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return "@@TIMEOUT"

    def wait_ready(self, timeout: float = READY_S) -> None:
        """Return once the engine has said it is ready (at once if it said so before)."""
        if self.ready:
            return
        if self._answer(timeout) != "@@READY":
            raise RuntimeError(f"engine {self.name} failed to start:\n" + "\n".join(self.tail))
        self.ready = True

    def run(self, prompt: list[int], max_tokens: int, reset: bool = True) -> dict[str, Any]:
        return self._ask({"prompt": prompt, "max_tokens": max_tokens, "reset": reset})

    def _ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self._answer(ANSWER_S)
        if not line.startswith("@@RESULT"):
            raise RuntimeError(f"engine {self.name} died:\n" + "\n".join(self.tail))
        # a store's native library may write its log on the same line, after the answer
        result, _ = json.JSONDecoder().raw_decode(line[len("@@RESULT") :].lstrip())
        return dict(result)

    def error(self) -> str:
        """The last error line the process printed ("" if none): why it failed."""
        lines = [RANK.sub("", ln).strip() for ln in self.tail]
        raised = [ln for ln in lines if RAISED.match(ln)]
        mentioned = [ln for ln in lines if "Error" in ln or "Exception" in ln]
        lines = raised or mentioned
        return lines[-1][:400] if lines else ""

    def run_trace(
        self,
        requests: list[dict[str, Any]],
        concurrency: int,
        reset: bool = True,
        skip_cache: bool = False,
    ) -> dict[str, Any]:
        """Serve ``requests`` with up to ``concurrency`` in flight (``peers_concurrent``)."""
        return self._ask(
            {
                "op": "trace",
                "requests": requests,
                "concurrency": concurrency,
                "reset": reset,
                "skip_cache": skip_cache,
            }
        )

    def close(self) -> None:
        """Ask the engine to exit, kill it after 30 s; idempotent."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        if not self._log.closed:
            self._log.close()


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
