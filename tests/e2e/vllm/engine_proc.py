"""One vLLM engine in its own process, driven line by line over stdin/stdout.

Started by the e2e fixtures (``conftest.py``) as ``python engine_proc.py '<json spec>'``. A
fresh process per engine is the only way to be sure an engine has never seen a prompt (vLLM
keeps global state per process). Protocol: the engine prints ``@@READY`` once loaded; each
stdin line is a JSON command, answered by one ``@@RESULT <json>`` line (vLLM logs to stdout
too, so answers carry a marker).

Spec keys beyond vLLM's: ``engine_args`` (more ``LLM`` keyword arguments, e.g.
``kv_cache_dtype`` or ``disable_hybrid_kv_cache_manager``), ``tp`` (tensor-parallel size:
each rank gets its share of the cores), ``executor`` (vLLM's
``distributed_executor_backend``), ``prefix_caching``, ``connector`` (the
``kv_transfer_config``).

Commands: ``{"op": "generate", "prompts": [[ids...]], "max_tokens": n}`` returns each output's
token ids and ``num_cached_tokens`` plus vLLM's prefix-cache counters (local and external);
``{"op": "exit"}`` shuts the engine down.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def build_engine(spec: dict[str, Any]) -> Any:
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "model": spec["model"],
        "dtype": spec.get("dtype", "float32"),
        "block_size": spec.get("block_size", 32),
        "max_model_len": spec.get("max_model_len", 1024),
        "max_num_seqs": spec.get("max_num_seqs", 16),
        "kv_cache_memory_bytes": spec.get("kv_cache_bytes", 64 << 20),
        "enable_prefix_caching": spec.get("prefix_caching", True),
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "disable_log_stats": False,
        "seed": 0,
    }
    kwargs.update(spec.get("engine_args", {}))
    if spec.get("connector"):
        kwargs["kv_transfer_config"] = spec["connector"]
    if spec.get("tp"):
        kwargs["tensor_parallel_size"] = spec["tp"]
        _bind_ranks(int(spec["tp"]))
    if spec.get("executor"):
        kwargs["distributed_executor_backend"] = spec["executor"]
    return LLM(**kwargs)


def _bind_ranks(tp: int) -> None:
    """Give each tensor-parallel CPU worker its own share of this process's cores. vLLM's CPU
    backend binds one rank per NUMA node by default, and these machines have one node."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cpus = sorted(os.sched_getaffinity(0))
    per = len(cpus) // tp
    if per < 1:
        raise RuntimeError(f"tensor_parallel_size {tp} needs {tp} cores, this process has {cpus}")
    shares = [cpus[i * per : (i + 1) * per] for i in range(tp)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, s)) for s in shares)


def counters(llm: Any) -> dict[str, float]:
    """vLLM's prefix-cache counters and the connector's ``vllm:kvstore_*`` counters
    (Prometheus snapshot), summed over engines."""
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if "kvstore_" in m.name or m.name.endswith(("prefix_cache_hits", "prefix_cache_queries")):
            out[m.name] = out.get(m.name, 0.0) + float(getattr(m, "value", 0.0))
    return out


def generate(llm: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams

    sp = SamplingParams(
        max_tokens=cmd.get("max_tokens", 8), temperature=0.0, detokenize=False,
        ignore_eos=True,
    )
    prompts = [{"prompt_token_ids": p} for p in cmd["prompts"]]
    before = counters(llm)
    start = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    elapsed = time.perf_counter() - start
    after = counters(llm)
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "cached": [o.num_cached_tokens for o in outs],
        "metrics": {k: after[k] - before.get(k, 0.0) for k in after},
        "seconds": elapsed,
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    llm = build_engine(spec)
    print("@@READY", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        try:
            result: dict[str, Any] = generate(llm, cmd)
        except Exception as exc:  # report, keep serving: the test decides what it means
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print("@@RESULT " + json.dumps(result), flush=True)
    del llm


if __name__ == "__main__":
    main()
