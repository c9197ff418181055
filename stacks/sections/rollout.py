"""`rollout`: how a new version reaches the replicas (Argo canary, rolling update, LWS partition)."""

from __future__ import annotations

from pydantic import Field, field_validator

from stacks.sections.common import Model


class RolloutSettings(Model):
    enabled: bool = Field(True, description="roll new versions out as an Argo Rollouts canary")
    steps: list[int] = Field(default_factory=lambda: [5, 50, 100], description="canary traffic percentages, ending at 100")
    pause_seconds: int = Field(600, ge=60, le=86400, description="time at each step while analysis runs")
    max_error_rate: float = Field(0.01, gt=0, lt=1, description="abort when the canary's 5xx ratio exceeds this")
    max_p99_latency_seconds: float | None = Field(
        None, gt=0,
        description="abort when the canary's P99 end-to-end latency exceeds this; the model class's end-to-end "
        "budget (monitoring.e2e_p99_seconds) when unset",
    )
    analysis_interval_seconds: int = Field(60, ge=10, le=3600, description="how often the analysis queries Prometheus")
    failure_limit: int = Field(2, ge=0, le=20, description="failed measurements tolerated before abort")
    max_surge: int = Field(
        1, ge=0, le=8,
        description="replicas (whole node groups when multi-node) a rolling update may add above the current "
        "count; 0 replaces one replica at a time (one replica less while it loads). An Argo canary always "
        "needs one",
    )
    partition: int = Field(
        0, ge=0, le=100,
        description="multi-node only: groups 0..partition-1 keep the current template during an update (the "
        "LeaderWorkerSet partition); set it to the replica count minus one to update one group first",
    )

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("expected at least one step, ending at 100")
        if any(not 0 < x <= 100 for x in v):
            raise ValueError(f"expected percentages in 1..100, got {v}")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"expected strictly increasing percentages, got {v}")
        if v[-1] != 100:
            raise ValueError(f"expected the last step to be 100, got {v[-1]}")
        return v
