"""`monitoring`: the in-cluster Prometheus, alert thresholds and the latency objectives."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stacks.sections.common import Model, Name


class MonitoringSettings(Model):
    enabled: bool = Field(True, description="monitors, rules, alerts, dashboard and dcgm-exporter")
    namespace: Name = Field("monitoring", description="namespace of Prometheus and Grafana")
    prometheus_url: str = Field(
        "http://prometheus-operated.monitoring.svc:9090", description="Prometheus the autoscaler and analysis query"
    )
    model_class: Literal["chat", "reasoning"] | None = Field(
        None,
        description="SLO class of the served model (sets the defaults of e2e_p99_seconds and "
        "min_tokens_per_second): reasoning models (DeepSeek-R1 and its distills) think for minutes before they "
        "answer; inferred from serving.model when unset",
    )
    ttft_p99_seconds: float = Field(2.0, gt=0, description="alert when P99 time to first token exceeds this")
    e2e_p99_seconds: float | None = Field(
        None, gt=0, description="alert when P99 end-to-end latency exceeds this; the model class's default when unset"
    )
    min_tokens_per_second: float | None = Field(
        None, gt=0, le=1000,
        description="token-rate objective: alert when the P99 time between two output tokens of a request exceeds "
        "1/this; the model class's default when unset",
    )
    p99_regression_ratio: float = Field(1.5, gt=1, description="alert when P99 is this many times last day's")
    error_rate: float = Field(0.02, gt=0, lt=1, description="alert when the failed-request ratio exceeds this")
    kv_cache_usage: float = Field(0.9, gt=0, le=1, description="alert when KV cache usage exceeds this")
    at_max_replicas_minutes: int = Field(30, ge=5, description="alert when pinned at max replicas this long")
    triton_queue_seconds: float = Field(
        1.0, gt=0, description="alert when requests wait longer than this in Triton's queue (server: triton)"
    )
    selector_labels: dict[str, str] = Field(
        default_factory=dict,
        description="labels added to monitors and rules so the Prometheus selects them (e.g. release: kube-prometheus-stack)",
    )
    retention_days: int = Field(
        15, ge=2, le=365,
        description="days Prometheus keeps samples (at least 2: the regression alert compares with the same hour "
        "a day earlier); sizes its persistent volume",
    )
    samples_per_second: int = Field(
        20000, ge=1000, le=10_000_000,
        description="samples Prometheus ingests per second (prometheus_tsdb_head_samples_appended_total rate); "
        "sizes its persistent volume",
    )
    storage_class: str | None = Field(
        None, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="StorageClass of Prometheus' volume; the cluster's default when unset",
    )
    dcgm_profiling_metrics: bool = Field(
        False,
        description="have dcgm-exporter collect DCGM's profiling (DCP) fields, DCGM_FI_PROF_*; they need the "
        "SYS_ADMIN capability in the exporter (docs/operations.md), which is added only when this is on",
    )
