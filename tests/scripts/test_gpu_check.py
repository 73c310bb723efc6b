"""``scripts/gpu_check.py`` without CUDA: the plan, a real run as the GPU machine's Python
would see this machine (image packages and carried wheels only; every CUDA step skipped with
"no CUDA"), the report's shape, a hung step cut at its limit, and the h2d bench's cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.scripts.image import ROOT, image_python, load

gpu_check = load("gpu_check")
STEP_NAMES = ["machine", "wheels", "imports", "tests", "bench_tiers", "bench_h2d", "bench_engine"]


def test_dry_run_lists_every_step_within_eight_minutes(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out.splitlines()[-1])
    steps = {s["name"]: s for s in plan["steps"]}
    assert list(steps) == STEP_NAMES
    assert sum(s["budget_s"] for s in plan["steps"]) <= plan["budget_s"] <= 480
    tests = steps["tests"]["command"]
    assert tests[1:5] == ["-m", "pytest", "-m", "gpu"]
    assert {"tests/kvstore/tiers/test_device.py", "tests/engines/test_model.py"} <= set(tests)
    assert steps["bench_tiers"]["cuda_only"] and "cuda" in steps["bench_tiers"]["command"]
    assert "--quick" in steps["bench_h2d"]["command"]
    assert "--target" in steps["wheels"]["command"]


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """The whole check on this machine, through an interpreter that sees only what the GPU
    machine will have."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    python, site = image_python(tmp / "image")
    (tmp / "wheels").mkdir()
    out = tmp / "out"
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("OUT", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--python", str(python),
         "--out", str(out), "--wheels", str(tmp / "wheels"), "--site", str(tmp / "site")],
        env=env, capture_output=True, text=True, timeout=240, check=False)
    report = json.loads((out / "gpu-check.json").read_text())
    return proc.returncode, report, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run without CUDA")
def test_cpu_run_skips_cuda_steps_cleanly(cpu_run: tuple[int, dict[str, Any], Path]) -> None:
    rc, report, _ = cpu_run
    steps = {s["name"]: s for s in report["steps"]}
    assert rc == 0 and report["ok"] and report["finished"]
    assert list(steps) == STEP_NAMES
    assert report["machine"]["cuda"] is False and report["machine"]["torch"]
    assert {k: steps[k]["status"] for k in STEP_NAMES} == {
        "machine": "pass", "wheels": "skip", "imports": "pass", "tests": "skip",
        "bench_tiers": "skip", "bench_h2d": "skip", "bench_engine": "skip"}
    for name in ("bench_tiers", "bench_h2d", "bench_engine"):
        assert steps[name]["reason"] == "no CUDA"
    assert "make gpu-wheels" in steps["wheels"]["reason"]


def test_report_shape(cpu_run: tuple[int, dict[str, Any], Path]) -> None:
    _, report, out = cpu_run
    assert {"check", "started", "duration_s", "budget_s", "finished", "machine", "summary",
            "ok", "steps"} <= set(report)
    assert sum(report["summary"].values()) == len(report["steps"])
    for step in report["steps"]:
        assert {"name", "status", "reason", "duration_s", "budget_s", "command", "returncode",
                "counts", "tests", "rows", "detail"} <= set(step)
        assert step["status"] in ("pass", "fail", "skip", "timeout")
        assert step["duration_s"] <= step["budget_s"] + gpu_check.KILL_GRACE_S
    log = (out / "gpu-check.log").read_text()
    assert all(f"=== {name}:" in log for name in STEP_NAMES)


def test_modules_and_gpu_tests_load_with_the_image_packages(
        cpu_run: tuple[int, dict[str, Any], Path]) -> None:
    _, report, _ = cpu_run
    steps = {s["name"]: s for s in report["steps"]}
    imports = steps["imports"]["detail"]
    assert imports["errors"] == {} and imports["imported"] > 100
    assert all("vllm" in why for why in imports["skipped"].values())
    tests = steps["tests"]
    names = {t["test"].rsplit("::", 1)[-1].split("[")[0] for t in tests["tests"]}
    assert {"test_cuda_round_trip", "test_cuda_matches_cpu",
            "test_cuda_matches_transformers"} <= names
    if not torch.cuda.is_available():
        assert tests["counts"]["skipped"] == len(tests["tests"]) >= 4
        assert tests["reason"] == "needs CUDA"


def test_a_hung_step_is_cut_and_the_report_still_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hang = [sys.executable, "-c", "import time; time.sleep(120)"]
    monkeypatch.setattr(gpu_check, "STEPS", (gpu_check.Step("bench_h2d", 1, False, "hangs"),))
    monkeypatch.setattr(gpu_check, "command", lambda ctx, name: hang)
    rc = gpu_check.main(["--out", str(tmp_path), "--wheels", str(tmp_path)])
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    (step,) = report["steps"]
    assert rc == 1 and not report["ok"] and report["finished"]
    assert step["status"] == "timeout" and step["duration_s"] < 1 + 2 * gpu_check.KILL_GRACE_S


def test_h2d_cases_put_the_blocks_in_the_pages_on_cpu() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_h2d

    rows = bench_h2d.bench_layout(bench_h2d.Layout(4, 4096, 6), torch.device("cpu"), reps=1)
    assert {r["case"] for r in rows} >= {"per page, pageable", "staged, pageable buf",
                                         "batched", "engine scatter_blocks"}
    assert all(r["value"] > 0 and r["baseline"] == "plain copy" for r in rows)


def test_failed_gpu_tests_are_named_in_the_reason(tmp_path: Path) -> None:
    ctx = gpu_check.Ctx(gpu_check.argparse.Namespace(
        python=sys.executable, out=str(tmp_path), site=str(tmp_path), wheels=str(tmp_path),
        budget_s=10.0, require_cuda=False))
    (ctx.work / "tests.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.a" name="test_ok" time="1.5"/>'
        '<testcase classname="tests.a" name="test_bad" time="0.2"><failure message="boom&#10;'
        'more"/></testcase><testcase classname="tests.a" name="test_gpu" time="0">'
        '<skipped message="needs CUDA"/></testcase></testsuite></testsuites>')
    res = gpu_check.Result("tests", "", 120, returncode=1)
    gpu_check.finish_tests(ctx, res, "")
    assert res.counts == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    assert res.status == "fail" and res.reason == "failed: tests.a::test_bad"
    assert res.tests[1]["message"] == "boom"
    gpu_check.shutil.rmtree(ctx.work)
