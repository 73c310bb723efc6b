"""The planner's settings: one frozen pydantic model whose field descriptions are also the
``--help`` of ``kvstore-planner`` (:mod:`engines.planner.cli`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PlannerSettings(BaseModel):
    """Targets, the rules against flapping, and where to find the fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    router: str = Field(description="URL of the kvstore-router whose workers to plan (its "
                        "/stats lists them and their roles)")
    ttft_target_s: float = Field(1.0, gt=0, description="time-to-first-token target, seconds; "
                                 "the prefill pool is judged by its prefill latency against "
                                 "it, the decode pool by its own time to first token only when "
                                 "there is no prefill pool")
    itl_target_s: float = Field(0.1, gt=0, description="inter-token latency target of the "
                                "decode pool, seconds")
    percentile: float = Field(90.0, gt=0, le=100, description="which percentile of the "
                              "window's requests is held to the targets")
    max_queue: float = Field(4.0, gt=0, description="waiting requests per worker above which "
                             "a pool counts as over target even before its latencies show it")
    window_s: float = Field(8.0, gt=0, description="seconds of finished requests each "
                            "judgement looks at")
    min_samples: int = Field(3, ge=1, description="finished requests a pool needs in the "
                             "window before its latency is judged")
    interval_s: float = Field(1.0, gt=0, description="seconds between judgements")
    patience: int = Field(3, ge=1, description="consecutive judgements a pool must be over "
                          "target before the planner acts (hysteresis)")
    cooldown_s: float = Field(10.0, ge=0, description="seconds after an action before the "
                              "next one (a moved worker's new latencies must show first)")
    relax: float = Field(0.7, gt=0, lt=1, description="a pool gives up a worker only while "
                         "its load is under this fraction of its targets")
    min_pool: int = Field(1, ge=1, description="workers each pool keeps at least")
    fleet_size: int = Field(0, ge=0, description="the most workers the planner rebalances by "
                            "itself; past it (and whenever no move can help) it prints a scale "
                            "recommendation for an autoscaler instead; 0: no limit")
    token_file: str | None = Field(None, description="file holding the fleet's bearer token "
                                   "(the workers' and the router's --token-file), sent to "
                                   "both; role switches need it")
    kvstore: str | None = Field(None, description="URL of the kvstore server the workers "
                                "share: every cache_report_s the planner prints its capacity "
                                "advice (what twice each tier's capacity would save, in prefill "
                                "seconds at the fleet's measured prefill rate) beside the "
                                "split; none: no cache report")
    kvstore_token_file: str | None = Field(None, description="file holding the kvstore "
                                           "server's token (for --kvstore)")
    cache_report_s: float = Field(30.0, gt=0, description="seconds between two cache reports")
    metrics_port: int = Field(0, ge=0, le=65535, description="serve Prometheus metrics "
                              "(pool sizes, pressure, moves, recommendations) on this port; "
                              "0: off")
    log_ticks: bool = Field(False, description="also print one JSON line per judgement "
                            "(pool sizes, latencies, pressure), for plots")
    duration_s: float = Field(0.0, ge=0, description="stop after this many seconds; 0: run "
                              "until interrupted")
    dry_run: bool = Field(False, description="print what would be done, switch nothing")

    @model_validator(mode="after")
    def _check(self) -> PlannerSettings:
        for name in ("router", "kvstore"):
            url = getattr(self, name)
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} must be an http:// or https:// URL, got {url!r}")
        if self.cooldown_s and self.cooldown_s < self.interval_s:
            raise ValueError("cooldown_s shorter than interval_s would act on every judgement; "
                             "raise cooldown_s or lower interval_s")
        return self
