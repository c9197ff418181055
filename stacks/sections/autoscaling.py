"""`autoscaling`: KEDA scaling of the serving replicas."""

from __future__ import annotations

from pydantic import Field, model_validator

from stacks.sections.common import Model


class AutoscalingSettings(Model):
    enabled: bool = Field(True, description="scale serving replicas with KEDA on queue depth and load")
    min_replicas: int | None = Field(None, ge=1, le=100, description="lower bound; serving.replicas when unset")
    max_replicas: int = Field(4, ge=1, le=100, description="upper bound (each replica needs its GPUs)")
    waiting_per_replica: float = Field(
        4.0, gt=0, description="target vllm:num_requests_waiting per replica (the primary signal)"
    )
    requests_per_second_per_replica: float = Field(2.0, gt=0, description="target request rate per replica")
    kv_cache_usage: float = Field(
        0.75, gt=0, le=1,
        description="saturation signal: target mean vllm:kv_cache_usage_perc (share of KV cache blocks in use) "
        "over the replicas; past it, new requests queue and running ones get preempted",
    )
    scale_up_stabilization_seconds: int = Field(60, ge=0, le=3600, description="scale-up stabilisation window")
    scale_down_stabilization_seconds: int = Field(
        1800, ge=600, le=86400, description="scale-down stabilisation (longer than a model load, so no flapping)"
    )
    polling_interval_seconds: int = Field(15, ge=5, le=300, description="how often KEDA queries Prometheus")
    fallback_after_failures: int = Field(
        3, ge=1, le=100,
        description="failed Prometheus queries in a row (one per polling interval) after which KEDA holds the "
        "current replica count (never below min_replicas) instead of acting on no data (KEDA fallback)",
    )

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        return self
