"""The CUDA checks, ready to run in one call on a GPU machine with no network.

``make gpu-check`` (or ``python3 scripts/gpu_check.py``) runs, each step in its own process
group under its own time limit and all of them under one total budget (8 minutes):

    machine       what the machine is: nvidia-smi, torch's CUDA device, package versions
    wheels        install the carried wheels (``.whl/``, from ``make gpu-wheels``) to /tmp/site
    imports       every module of kvstore imports there; requirements met (versions there)
    tests         the ``gpu``-marked tests, among them the decoder on CUDA against transformers
    bench_tiers   bench/bench_tiers.py --quick --device cuda --only device
    bench_h2d     bench/bench_h2d.py --quick: slab extents to GPU pages, per page vs batched
    bench_engine  bench/bench_engine.py --quick --device cuda --only decode,ttft

Steps run with ``PYTHONPATH=<site>:<repo>`` and Hugging Face offline. It writes one JSON report,
``gpu-check.json``, and the whole output, ``gpu-check.log``, into ``$OUT`` (else
``bench/results/``), rewritten after every step, and prints a table at the end. Without CUDA
the CUDA-only steps are skipped with the reason ("no CUDA"), which is how the tests run it
here; ``--dry-run`` prints the plan and runs nothing. Exit status: 0 when no step failed or ran
out of time (and, with ``--require-cuda``, CUDA was there), else 1; the report is written
either way.

    python3 scripts/gpu_check.py [--dry-run] [--out DIR] [--only a,b] [--budget-s 470]
        [--wheels .whl] [--site /tmp/site] [--require-cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 470.0  # all steps together: 8 minutes, less a margin for writing the report
KILL_GRACE_S = 5.0  # between SIGTERM and SIGKILL of a step that ran out of time
TEST_TIMEOUT_S = 90  # one gpu test (pytest-timeout), so a hung test fails alone
# Test folders the gpu tests are not run from, and why.
TEST_EXCLUDED = {"tests/e2e/": "needs vllm, which is not carried"}
# Packages whose absence there skips a module's import instead of failing it.
NOT_CARRIED = {"vllm": "not carried (vLLM e2e only)", "boto3": "the s3 extra is not carried",
               "botocore": "the s3 extra is not carried"}
PACKAGES = ("kvstore", "server", "engines", "connectors")
BENCHES = ("bench_tiers", "bench_h2d", "bench_engine")  # the check's benches, imported first


class Step(NamedTuple):
    name: str
    budget_s: float
    cuda: bool  # skipped without CUDA
    about: str


STEPS = (
    Step("machine", 45, False, "nvidia-smi, torch's CUDA device, versions"),
    Step("wheels", 45, False, "pip install the carried wheels to the site folder"),
    Step("imports", 45, False, "import every module; kvstore's requirements met there"),
    Step("tests", 120, False, "pytest -m gpu over the test files with gpu tests"),
    Step("bench_tiers", 60, True, "device tier put/get on cuda vs a pinned copy"),
    Step("bench_h2d", 60, False, "slab extents to GPU pages: per page vs batched vs pinned"),
    Step("bench_engine", 90, True, "decoder vs transformers and TTFT with kvstore, on cuda"),
)


@dataclass
class Result:
    name: str
    about: str
    budget_s: float
    status: str = "planned"  # pass | fail | skip | timeout | planned
    reason: str = ""
    duration_s: float = 0.0
    command: list[str] = field(default_factory=list)
    returncode: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    tests: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


class Ctx:
    """Paths, environment and time of one check run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.python = args.python
        self.out = Path(args.out or os.environ.get("OUT") or ROOT / "bench" / "results")
        self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.site, self.wheels = Path(args.site), Path(args.wheels)
        self.budget_s = args.budget_s
        self.deadline = time.monotonic() + args.budget_s
        self.require_cuda = bool(args.require_cuda)
        self.cuda: bool | None = None  # learnt by the machine step
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(self.site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
            PIP_DISABLE_PIP_VERSION_CHECK="1")
        self.log_path = self.out / "gpu-check.log"

    def log(self, text: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")


# -- commands ------------------------------------------------------------------------------
def gpu_test_files() -> tuple[list[str], dict[str, str]]:
    """Test files that hold ``gpu``-marked tests, and the ones left out with the reason."""
    files, left = [], {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "mark.gpu" not in path.read_text(encoding="utf-8"):
            continue
        why = next((r for p, r in TEST_EXCLUDED.items() if rel.startswith(p)), None)
        if why:
            left[rel] = why
        else:
            files.append(rel)
    return files, left


def command(ctx: Ctx, name: str) -> list[str]:
    py, here, work = ctx.python, str(Path(__file__).resolve()), ctx.work
    if name in ("machine", "imports"):
        return [py, here, "--probe", name]
    if name == "wheels":
        return [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                "--no-cache-dir", "--upgrade", "--target", str(ctx.site),
                *map(str, sorted(ctx.wheels.glob("*.whl")))]
    if name == "tests":
        return [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                "-o", f"timeout={TEST_TIMEOUT_S}", f"--junitxml={work / 'tests.xml'}",
                *gpu_test_files()[0]]
    if name == "bench_tiers":
        return [py, "bench/bench_tiers.py", "--quick", "--device", "cuda", "--only", "device",
                "--json", str(work / "bench_tiers.json")]
    if name == "bench_h2d":
        return [py, "bench/bench_h2d.py", "--quick", "--json", str(work / "bench_h2d.json")]
    if name == "bench_engine":
        return [py, "bench/bench_engine.py", "--quick", "--device", "cuda", "--only",
                "decode,ttft", "--json", str(work / "bench_engine.json")]
    raise ValueError(f"unknown step {name!r}")


def why_skip(ctx: Ctx, step: Step) -> str | None:
    if step.cuda and not ctx.cuda:
        return "no CUDA"
    if step.name == "wheels" and not any(ctx.wheels.glob("*.whl")):
        return f"no wheels in {ctx.wheels} (run `make gpu-wheels` where pip can download)"
    if step.name == "tests" and not gpu_test_files()[0]:
        return "no test file holds gpu-marked tests"
    return None


# -- running a step --------------------------------------------------------------------------
def run_step(ctx: Ctx, step: Step) -> Result:
    res = Result(step.name, step.about, step.budget_s, command=command(ctx, step.name))
    left = ctx.deadline - time.monotonic()
    skip = why_skip(ctx, step) or ("out of the total time budget" if left < 5 else None)
    ctx.log(f"\n=== {step.name}: {step.about}\n$ {' '.join(res.command)}")
    if skip:
        res.status, res.reason = "skip", skip
        ctx.log(f"skipped: {skip}")
        return res
    limit = min(step.budget_s, left)
    start = time.monotonic()
    # The step writes straight into the log, so that its output is there even if this
    # process is killed before the step ends.
    with open(ctx.log_path, "ab") as log:
        begin = log.tell()
        proc = subprocess.Popen(res.command, cwd=ROOT, env=ctx.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            res.returncode = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            stop(proc)
            res.status, res.reason = "timeout", f"ran past its {limit:.0f} s"
    res.duration_s = round(time.monotonic() - start, 2)
    with open(ctx.log_path, "rb") as log:
        log.seek(begin)
        text = log.read().decode("utf-8", errors="replace")
    try:
        FINISH[step.name](ctx, res, text)
    except Exception as exc:  # a report we cannot read is a failed step, not a crash
        res.status, res.reason = "fail", f"could not read its results: {exc!r}"
    if res.status == "planned":
        res.status = "pass" if res.returncode == 0 else "fail"
    if res.status in ("fail", "timeout") and not res.reason:
        res.reason = f"exit status {res.returncode}"
    if res.status in ("fail", "timeout"):
        tail = "\n".join(text.splitlines()[-30:])
        print(f"--- {step.name} {res.status}, last lines:\n{tail}\n---", flush=True)
    return res


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the step's process group, SIGKILL it if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def last_json(text: str) -> dict[str, Any]:
    """The JSON object a probe printed as its last line."""
    line = [x for x in text.splitlines() if x.startswith("{")][-1]
    doc: dict[str, Any] = json.loads(line)
    return doc


def finish_machine(ctx: Ctx, res: Result, text: str) -> None:
    if res.returncode != 0:
        ctx.cuda = False
        return
    res.detail = last_json(text)
    ctx.cuda = bool(res.detail.get("cuda"))
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=20, check=False)
        res.detail["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    else:
        res.detail["nvidia_smi"] = None
    if not ctx.cuda and ctx.require_cuda:
        res.status, res.reason = "fail", "torch sees no CUDA device"


def finish_imports(ctx: Ctx, res: Result, text: str) -> None:
    if res.returncode != 0:
        return
    res.detail = last_json(text)
    res.counts = {"modules": res.detail["imported"], "skipped": len(res.detail["skipped"]),
                  "errors": len(res.detail["errors"])}
    if res.detail["errors"]:
        res.status, res.reason = "fail", "modules failed to import: " + ", ".join(
            sorted(res.detail["errors"]))


def finish_tests(ctx: Ctx, res: Result, text: str) -> None:
    files, left = gpu_test_files()
    res.detail = {"files": files, "left_out": left}
    xml = ctx.work / "tests.xml"
    if not xml.exists():
        return
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(tag)
            if el is not None:
                outcome = name
                message = ((el.get("message") or "").splitlines() or [""])[0][:300]
        res.tests.append({"test": f"{case.get('classname')}::{case.get('name')}",
                          "outcome": outcome, "duration_s": float(case.get("time") or 0),
                          "message": message})
    for key in ("passed", "failed", "error", "skipped"):
        res.counts[key] = sum(t["outcome"] == key for t in res.tests)
    if res.status == "timeout":
        return
    bad = [t["test"] for t in res.tests if t["outcome"] in ("failed", "error")]
    if bad:
        res.status, res.reason = "fail", "failed: " + ", ".join(bad)
    elif res.returncode == 5:
        res.status, res.reason = "fail", "no gpu test was collected"
    elif res.returncode == 0 and not res.counts["passed"] and res.counts["skipped"]:
        res.status = "skip"
        res.reason = "; ".join(sorted({t["message"] for t in res.tests if t["message"]}))


def finish_bench(ctx: Ctx, res: Result, text: str) -> None:
    path = ctx.work / f"{res.name}.json"
    if not path.exists():
        return
    doc = json.loads(path.read_text(encoding="utf-8"))
    res.rows = doc.get("rows", [])
    res.detail = {"machine": doc.get("machine", {})}
    if doc.get("skipped") and res.returncode == 0:
        res.status, res.reason = "skip", str(doc["skipped"])


FINISH: dict[str, Callable[[Ctx, Result, str], None]] = {
    "machine": finish_machine, "wheels": lambda ctx, res, text: None,
    "imports": finish_imports, "tests": finish_tests, "bench_tiers": finish_bench,
    "bench_h2d": finish_bench, "bench_engine": finish_bench,
}


# -- probes (run as steps, in their own process) ----------------------------------------------
def probe_machine() -> dict[str, Any]:
    from importlib import metadata

    import torch

    doc: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                           "cuda": torch.cuda.is_available()}
    if doc["cuda"]:
        p = torch.cuda.get_device_properties(0)
        doc.update(device=p.name, device_count=torch.cuda.device_count(),
                   capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                   multiprocessors=p.multi_processor_count)
    versions: dict[str, str | None] = {}
    for dist in ("numpy", "cupy-cuda13x", "cupy-cuda12x", "numba", "transformers", "msgpack",
                 "xxhash", "uvloop", "pytest", "fastapi", "pydantic", "lmdb"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    doc["versions"] = versions
    return doc


def probe_imports() -> dict[str, Any]:
    """Import every module of kvstore's packages and the check's benches; check kvstore's
    requirements against what is installed here (the walk of ``scripts/gpu_wheels.py``)."""
    import importlib

    sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "bench")]
    import gpu_wheels

    unmet = [n._asdict() for n in gpu_wheels.walk(gpu_wheels.roots()) if not n.satisfied]
    imported, skipped, errors = 0, {}, {}
    mods = list(BENCHES)
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "__main__.py":  # runs a command line when imported
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    for mod in mods:
        try:
            importlib.import_module(mod)
            imported += 1
        except ModuleNotFoundError as exc:
            top = (exc.name or "").split(".")[0]
            if top in NOT_CARRIED:
                skipped[mod] = f"needs {top}: {NOT_CARRIED[top]}"
            else:
                errors[mod] = f"{type(exc).__name__}: {exc}"
        except (Exception, SystemExit) as exc:
            errors[mod] = f"{type(exc).__name__}: {exc}"
    return {"imported": imported, "skipped": skipped, "errors": errors, "unmet": unmet}


# -- the report ------------------------------------------------------------------------------
def report(ctx: Ctx, results: list[Result], started: float, done: bool) -> dict[str, Any]:
    statuses = [r.status for r in results]
    machine = next((r.detail for r in results if r.name == "machine"), {})
    doc = {
        "check": "gpu",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "budget_s": ctx.budget_s,
        "finished": done,
        "host": platform.node(),
        "machine": machine,
        "summary": {s: statuses.count(s) for s in ("pass", "fail", "timeout", "skip")},
        "ok": done and not any(s in ("fail", "timeout") for s in statuses),
        "steps": [asdict(r) for r in results],
    }
    ctx.out.mkdir(parents=True, exist_ok=True)
    tmp = ctx.out / "gpu-check.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    tmp.replace(ctx.out / "gpu-check.json")
    return doc


def summary_line(r: Result) -> str:
    if r.counts:
        return " ".join(f"{k}={v}" for k, v in r.counts.items())
    if r.rows:
        return f"{len(r.rows)} rows"
    return ""


def print_table(doc: dict[str, Any], results: list[Result], path: Path) -> None:
    m = doc["machine"]
    print(f"\nmachine: {m.get('device') or 'no CUDA device'}; torch {m.get('torch')} "
          f"(CUDA {m.get('torch_cuda')}); python {m.get('python')}; "
          f"nvidia-smi: {m.get('nvidia_smi')}")
    print(f"{'step':<14}{'status':<9}{'time s':>8}{'budget':>8}  detail")
    for r in results:
        detail = " ".join(filter(None, [summary_line(r), r.reason]))
        print(f"{r.name:<14}{r.status:<9}{r.duration_s:>8.1f}{r.budget_s:>8.0f}  {detail[:110]}")
    rows = [(r.name, row) for r in results for row in r.rows]
    if rows:
        print(f"\n{'bench':<13}{'case':<38}{'value':>10} {'unit':<9}{'ratio':>7}  baseline")
        for name, row in rows:
            size = row.get("block_bytes")
            case = f"{row['case']}" + (f" {size >> 10}K" if isinstance(size, int) else "")
            ratio, match = row.get("ratio"), row.get("tokens_match")
            note = "" if match is None else " (tokens match)" if match else " (TOKENS DIFFER)"
            print(f"{name:<13}{case[:37]:<38}{row['value']:>10.4g} {row['unit']:<9}"
                  f"{'-' if ratio is None else f'{ratio:.3f}':>7}  "
                  f"{row.get('baseline') or '-'}{note}")
    print(f"\n{'OK' if doc['ok'] else 'NOT OK'}: {doc['summary']}; report {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument("--out", help="report folder (default: $OUT, else bench/results)")
    ap.add_argument("--only", help="comma-separated steps (default: all)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="all steps together")
    ap.add_argument("--wheels", default=str(ROOT / ".whl"), help="carried wheels")
    ap.add_argument("--site", default="/tmp/site", help="where the wheels are installed")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the steps")
    ap.add_argument("--require-cuda", action="store_true", help="fail without a CUDA device")
    ap.add_argument("--probe", choices=("machine", "imports"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        found = probe_machine() if args.probe == "machine" else probe_imports()
        print(json.dumps(found, default=str))
        return 0
    names = [s.name for s in STEPS]
    only = args.only.split(",") if args.only else names
    unknown = sorted(set(only) - set(names))
    if unknown:
        ap.error(f"unknown steps {unknown}; known: {', '.join(names)}")
    steps = [s for s in STEPS if s.name in only]
    ctx = Ctx(args)
    if args.dry_run:
        plan = [{"name": s.name, "budget_s": s.budget_s, "cuda_only": s.cuda, "about": s.about,
                 "command": command(ctx, s.name)} for s in steps]
        for s in steps:
            print(f"{s.name:<14}{s.budget_s:>5.0f} s  {' '.join(command(ctx, s.name))}")
        print(json.dumps({"steps": plan, "budget_s": args.budget_s,
                          "tests_left_out": gpu_test_files()[1]}))
        shutil.rmtree(ctx.work, ignore_errors=True)
        return 0
    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.log_path.write_text(f"gpu check, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    started, results = time.time(), [Result(s.name, s.about, s.budget_s) for s in steps]
    if "machine" not in only:  # the CUDA-only steps still need to know
        ctx.cuda = bool(probe_cuda(ctx))
    doc: dict[str, Any]
    try:
        for i, step in enumerate(steps):
            print(f"[{time.time() - started:6.1f} s] {step.name}: {step.about}", flush=True)
            results[i] = run_step(ctx, step)
            doc = report(ctx, results, started, done=False)
    finally:
        doc = report(ctx, results, started, done=True)
        print_table(doc, results, ctx.out / "gpu-check.json")
        shutil.rmtree(ctx.work, ignore_errors=True)
    return 0 if doc["ok"] else 1


def probe_cuda(ctx: Ctx) -> bool:
    code = "import torch; print(int(torch.cuda.is_available()))"
    try:
        out = subprocess.run([ctx.python, "-c", code], env=ctx.env, capture_output=True,
                             text=True, timeout=60, check=False).stdout
    except subprocess.TimeoutExpired:
        return False
    return re.search(r"^1$", out, re.M) is not None


if __name__ == "__main__":
    sys.exit(main())
