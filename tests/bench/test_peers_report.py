"""The peers bench's report, without any peer: rows per case and store against no cache,
kvstore against the fastest peer, token identity, resources, and the rows that say what did
not run and why."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

# bench/ is a folder of scripts, not a package: load the one module by its path
_PATH = Path(__file__).resolve().parents[2] / "bench" / "peers_report.py"
_SPEC = importlib.util.spec_from_file_location("peers_report", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
pr = importlib.util.module_from_spec(_SPEC)
sys.modules["peers_report"] = pr  # dataclasses resolve the module by name
_SPEC.loader.exec_module(pr)


LABEL = {c.key: c.label for c in pr.CASES}


def _samples() -> Any:  # a pr.Samples (pr is loaded by path, unknown to mypy)
    s = pr.Samples()
    for ttft in (2.0, 2.2, 1.8):
        s.add("repeated", pr.NONE, pr.Sample(ttft, 0, True))
        s.add("restarted", pr.NONE, pr.Sample(ttft, 0, True))
    for ttft in (0.2, 0.3, 0.25):
        s.add("repeated", pr.KVSTORE, pr.Sample(ttft, 2080, True))
        s.add("restarted", pr.KVSTORE, pr.Sample(ttft, 2080, True))
    for ttft, same in ((0.5, True), (0.4, False), (0.45, True)):
        s.add("repeated", "lmcache", pr.Sample(ttft, 2048, same))
        s.add("restarted", "lmcache", pr.Sample(ttft, 2048, same))
    for ttft in (0.1, 0.1, 0.1):
        s.add("repeated", pr.LIMIT, pr.Sample(ttft, 2080, True))
        s.add("repeated", "mooncake", pr.Sample(0.6, 2080, True))
        s.add("restarted", "mooncake", pr.Sample(2.0, 0, True))
        s.add("repeated_again", pr.KVSTORE, pr.Sample(0.5, 2080, True))
        s.add("repeated_again", "lmcache", pr.Sample(0.25, 2048, True))
    return s


def test_rows_per_store_against_no_cache_and_kvstore_against_the_best_peer() -> None:
    rows = pr.case_rows(_samples(), ["kvstore", "lmcache", "mooncake"])
    first = [r for r in rows if r["case"] == LABEL["repeated"]]
    assert [r["store"] for r in first] == [
        pr.NONE,
        pr.LIMIT,
        "kvstore",
        "lmcache",
        "mooncake",
        "kvstore vs best peer",
    ]
    kv = first[2]
    assert kv["value"] == 0.25 and kv["baseline_value"] == 2.0 and kv["ratio"] == 8.0
    assert kv["cached_tokens"] == 2080 and kv["tokens_identical"] == "3/3"
    assert first[3]["tokens_identical"] == "2/3"
    versus = first[-1]
    assert versus["baseline"] == "lmcache" and versus["ratio"] == 1.8
    assert versus["target"] == 1.0 and versus["meets_target"] is True
    assert versus["hit_tokens_at_least_best_peer"] is True
    # the case no sample was taken for has no rows; the restart case has no engine-cache row
    assert not [r for r in rows if r["case"] == LABEL["new_question"]]
    restarted = [r for r in rows if r["case"] == LABEL["restarted"]]
    assert pr.LIMIT not in [r["store"] for r in restarted]
    assert restarted[-1]["target"] == 1.2
    # a case measured against another case's no-cache samples: no row of its own for them
    again = [r for r in rows if r["case"] == LABEL["repeated_again"]]
    assert [r["store"] for r in again] == ["kvstore", "lmcache", "kvstore vs best peer"]
    assert again[0]["baseline_value"] == 2.0 and again[0]["ratio"] == 4.0
    assert again[-1]["meets_target"] is False and again[0]["ttft_samples"] == [0.5] * 3


def test_no_peer_ran_means_no_comparison_row() -> None:
    s = pr.Samples()
    s.add("repeated", pr.NONE, pr.Sample(1.0, 0, True))
    s.add("repeated", pr.KVSTORE, pr.Sample(0.1, 64, True))
    rows = pr.case_rows(s, ["kvstore"])
    assert [r["store"] for r in rows] == [pr.NONE, "kvstore"]


def test_skipped_and_resource_rows_say_why_and_how_much() -> None:
    rows = pr.skipped_rows({"mooncake": "not installed (run `make peers`)"})
    stores = {r["store"]: r["skipped"] for r in rows if r["case"] == "all"}
    assert "CUDA" in stores["vllm OffloadingConnector"] and "make peers" in stores["mooncake"]
    assert {r["case"] for r in rows if r["store"] == "all"} == set(pr.NOT_RUN)
    res = pr.resource_row(
        "mooncake", ("mooncake_master", "mooncake_client"), (100 << 20, 1.0), (200 << 20, 3.5), 1024
    )
    assert res["processes"] == 2 and res["rss_growth_bytes_per_token"] == 102400
    assert res["cpu_s"] == 2.5
    table = pr.text_table([*pr.case_rows(_samples(), ["kvstore", "lmcache"]), res, *rows])
    assert "not run: CUDA/XPU only" in table and "2 process(es)" in table
    assert "| 1. repeated prompt" in pr.markdown(pr.case_rows(_samples(), ["kvstore"]))


def test_traffic_rows_add_the_tail_the_hit_share_and_the_throughput() -> None:
    s = pr.Samples()
    for i in range(100):
        s.add("traffic", pr.NONE, pr.Sample(1.0 + i / 100, 0, True, 2.0, 1000, 10))
        s.add("traffic", pr.KVSTORE, pr.Sample(0.1 + i / 1000, 500, i != 7, 1.0, 1000, 10))
    rows = pr.case_rows(s, ["kvstore"])
    kv = next(r for r in rows if r["store"] == "kvstore")
    assert kv["value"] == 0.1495 and kv["p99_s"] == 0.198
    assert kv["hit_share"] == 0.5 and kv["tokens_per_s"] == 1010.0
    assert kv["tokens_identical"] == "99/100"
    assert "p99_s" not in next(r for r in pr.case_rows(_samples(), ["kvstore"]))


def test_pressure_rows_compare_hit_shares_and_total_hit_tokens() -> None:
    """Case 4: a store whose RAM tier lost the working set's older prompts supplies fewer
    tokens; kvstore is compared with the fastest peer on the median and with the peer that
    supplied the most tokens over the whole working set (not on the median request)."""
    s = pr.Samples()
    for i in range(8):
        s.add("pressure", pr.NONE, pr.Sample(2.0, 0, True, 2.1, 1000, 8))
        s.add("pressure", pr.KVSTORE, pr.Sample(0.2, 992, True, 0.3, 1000, 8))
        # a peer that keeps only its RAM tier: a quarter of the prompts hit, fast when they do
        hit = i % 4 == 0
        s.add("pressure", "ram-only", pr.Sample(0.1 if hit else 2.0, 992 if hit else 0, True))
        s.add("pressure", "lmcache", pr.Sample(0.3, 768, True, 0.4, 1000, 8))
    rows = pr.case_rows(s, ["kvstore", "ram-only", "lmcache"])
    label = LABEL["pressure"]
    assert all(r["case"] == label for r in rows)
    assert [r["store"] for r in rows] == [
        pr.NONE,
        "kvstore",
        "ram-only",
        "lmcache",
        "kvstore vs best peer",
    ]
    kv = rows[1]
    assert kv["hit_share"] == 0.992 and kv["p99_s"] == 0.2 and kv["ratio"] == 10.0
    assert rows[2]["value"] == 2.0 and rows[3]["hit_share"] == 0.768
    versus = rows[-1]
    assert versus["baseline"] == "lmcache" and versus["ratio"] == 1.5
    assert versus["target"] == 1.2 and versus["meets_target"] is True
    assert versus["hit_tokens_at_least_best_peer"] is True
    # fewer tokens than the best peer over the working set fails the hit check, although
    # kvstore's median request supplied more tokens than that peer's
    for _ in range(4):
        s.add("pressure", pr.KVSTORE, pr.Sample(0.2, 0, True))
        s.add("pressure", "lmcache", pr.Sample(0.3, 992, True))
    versus = pr.case_rows(s, ["kvstore", "lmcache"])[-1]
    assert versus["hit_tokens_at_least_best_peer"] is False
    assert "4. capacity pressure" not in " ".join(pr.NOT_RUN)


def test_concurrent_traffic_throughput_is_over_the_trace_wall_time() -> None:
    """Case 3 with requests in flight at once: the requests' seconds overlap, so tokens per
    second are over the trace's wall time, and the case is no longer listed as not run."""
    s = pr.Samples()
    for i in range(4):
        s.add(pr.CONCURRENT, pr.NONE, pr.Sample(1.0 + i, 0, True, 2.0, 1000, 10))
        s.add(pr.CONCURRENT, pr.KVSTORE, pr.Sample(0.1, 750, True, 1.0, 1000, 10))
    s.walls[(pr.CONCURRENT, pr.KVSTORE)] = 2.0  # four requests of 1 s, two at a time
    rows = pr.case_rows(s, ["kvstore"])
    assert {r["case"] for r in rows} == {LABEL[pr.CONCURRENT]}
    kv = next(r for r in rows if r["store"] == "kvstore")
    assert kv["tokens_per_s"] == 2020.0 and kv["hit_share"] == 0.75
    none = next(r for r in rows if r["store"] == pr.NONE)
    assert none["tokens_per_s"] == 505.0  # no wall time: the requests' seconds, summed
    assert not [r for r in pr.skipped_rows({}, {}) if r["store"] == "all"]
