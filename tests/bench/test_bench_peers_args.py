"""The peers bench's command line: the model and case 3's concurrency, checked before
anything starts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# bench/ is a folder of scripts, not a package: its modules import each other by name
_BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(_BENCH))
_SPEC = importlib.util.spec_from_file_location("bench_peers", _BENCH / "bench_peers.py")
assert _SPEC is not None and _SPEC.loader is not None
bp = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bp)


def test_defaults_race_the_dense_model_with_four_requests_in_flight() -> None:
    args = bp.parse_args([])
    assert args.model == "qwen2" and args.concurrency == 4 and args.cases == "1,3,4,5"


def test_the_hybrid_model_and_one_request_at_a_time() -> None:
    args = bp.parse_args(["--quick", "--model", "gemma3", "--concurrency", "1", "--cases", "1"])
    assert args.model == "gemma3" and args.concurrency == 1
    assert bp.MODELS["gemma3"].quick_layers == 6
    assert bp.MODELS["gemma3"].engine_args == {"disable_hybrid_kv_cache_manager": False}


def test_a_peer_may_run_the_hybrid_model_with_the_hybrid_manager_off() -> None:
    args = bp.parse_args(["--model", "gemma3", "--hybrid-off", "lmcache"])
    assert args.hybrid_off == "lmcache"


@pytest.mark.parametrize(
    "argv",
    [
        ["--hybrid-off", "lmcache"],  # the dense model has no hybrid manager to turn off
        ["--model", "gemma3", "--hybrid-off", "kvstore"],  # kvstore's connector supports it
        ["--concurrency", "0"],
        ["--concurrency", "5"],  # more than an engine's max_num_seqs
        ["--model", "gemma3", "--layers", "5"],  # no full-attention layer
        ["--model", "llama"],
    ],
)
def test_bad_options_stop_before_anything_starts(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bp.parse_args(argv)
