"""Engines for time-to-first-token benches: one engine per process, beside one kvstore node
(or none), driven over its stdin and stdout.

An :class:`EngineProc` starts ``python bench/ttft_engines.py SPEC``; the spec names the engine:

- ``builtin``: the built-in decoder (``engines.decoder.runner.Engine``) with a
  ``RemoteStore`` on the node's URL (``kvstore``; None: no store, it recomputes);
- ``vllm``: the real vLLM CPU engine with ``connectors.vllm.KVStoreConnector`` on the node
  (``bench_vllm.worker``, which speaks the same protocol).

Each command is one prompt: the engine forgets its own prefix cache first, so the prompt is
served as by a fresh engine whose KV can only come from its node; the answer is the time to
its first token and the prompt tokens whose KV was loaded rather than computed.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_BLOCK = 16  # tokens per block of the built-in engine (vLLM's: bench_vllm.BLOCK)


class Answer(NamedTuple):
    """One prompt's result: seconds to its first token, prompt tokens loaded from kvstore."""

    seconds: float
    cached: int


def builtin_worker(spec: dict[str, Any]) -> None:
    """Serve ``{"prompt"}`` commands on the built-in engine; one thread, as in bench_engine."""
    import torch

    from engines.decoder.config import EngineConfig
    from engines.decoder.runner import Engine
    from engines.decoder.sampler import SamplingParams
    from engines.store_io import RemoteStore

    torch.set_num_threads(1)  # the machine is shared: one thread per engine keeps runs stable
    longest = spec["max_prompt"] + 1
    ecfg = EngineConfig(block_size=BUILTIN_BLOCK, num_blocks=longest // BUILTIN_BLOCK + 16,
                        max_batch_tokens=longest)  # a whole prompt in one step
    store = RemoteStore(spec["kvstore"]) if spec.get("kvstore") else None
    engine = Engine(spec["model"], ecfg, store)
    print("@@READY", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            break
        engine.reset_prefix_cache()  # nothing resident: a fresh worker
        seq = engine.add_request(cmd["prompt"], SamplingParams(max_tokens=1))
        while engine.has_work():
            engine.step()
        if seq.error is not None or seq.first_token_at is None:
            raise RuntimeError(f"the engine failed the prompt: {seq.error}")
        print("@@RESULT " + json.dumps({"seconds": seq.first_token_at - seq.arrival,
                                        "cached": seq.store_hit_tokens}), flush=True)
    if store is not None:
        store.close()


class EngineProc:
    """Driver of one engine process: ``send`` a prompt, then ``answer``; several engines may
    work at once (one prompt each)."""

    def __init__(self, spec: dict[str, Any], log: Path) -> None:
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.log_path = log
        self.proc = subprocess.Popen(
            [sys.executable, __file__, json.dumps(spec)], cwd=ROOT, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log_path.open("a") as log:  # the engine's own output, for a failure
            for line in self.proc.stdout:
                log.write(line)
                if line.startswith("@@"):
                    self._lines.put(line.strip())
        self._lines.put("@@EOF")

    def _tail(self) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-40:])

    def wait_ready(self, timeout: float = 600) -> None:
        if self._lines.get(timeout=timeout) != "@@READY":
            raise RuntimeError(f"engine failed to start ({self.log_path}):\n{self._tail()}")

    def send(self, prompt: list[int]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompt": prompt, "max_tokens": 1, "reset": True})
                              + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 600) -> Answer:
        line = self._lines.get(timeout=timeout)
        if not line.startswith("@@RESULT"):
            raise RuntimeError(f"engine died ({self.log_path}):\n{self._tail()}")
        doc = json.loads(line[len("@@RESULT"):])
        return Answer(float(doc["seconds"]), int(doc["cached"]))

    def run(self, prompt: list[int]) -> Answer:
        self.send(prompt)
        return self.answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    worker_spec: dict[str, Any] = json.loads(sys.argv[1])
    if worker_spec["engine"] == "builtin":
        builtin_worker(worker_spec)
    else:
        from bench_vllm import worker  # bench/ is sys.path[0] when run as a script

        worker(worker_spec)
