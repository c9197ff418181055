"""`observability`: managed Prometheus (VMP), request traces and logs (TLS)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stacks.sections.common import Model, Name


class TracingSettings(Model):
    """Spans of the in-cluster gateway and of vLLM, through an OpenTelemetry Collector, to
    VolcEngine (the stack's TLS trace instance, or APMPlus)."""

    enabled: bool = Field(True, description="trace requests: Envoy Gateway and vLLM export spans to the collector")
    sampling_percent: float = Field(
        1.0,
        ge=0,
        le=100,
        description="percent of requests the in-cluster gateway starts a trace for when the request arrives "
        "without a sampling decision; a request with a sampled W3C traceparent is always traced",
    )
    detailed: Literal["model", "worker", "all"] | None = Field(
        None,
        description="vLLM --collect-detailed-traces: per-request model forward/execute times on the span "
        "(blocking device syncs, so it costs throughput); off when unset",
    )
    backend: Literal["tls", "apmplus"] = Field(
        "tls", description="where the collector exports: tls (the stack's TLS trace instance) or apmplus"
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^https://[A-Za-z0-9.-]+(:\d+)?$",
        description="OTLP/HTTP base URL of the backend (the exporter appends /v1/traces); "
        "https://tls-<region>.volces.com:4318 or https://apmplus-<region>.volces.com:4318 when unset",
    )
    credentials_secret: Name = Field(
        "otel-exporter-credentials",
        description="Secret in the collector namespace with the exporter's credentials (tls: access_key_id and "
        "secret_access_key of a key that may write the trace topic; apmplus: app_key); created by operators",
    )
    collector_namespace: Name = Field("observability", description="namespace of the OpenTelemetry Collector")
    collector_replicas: int = Field(2, ge=1, le=10, description="OpenTelemetry Collector replicas")
    retention_days: int = Field(30, ge=1, le=3650, description="days the TLS trace instance keeps spans")


class RequestLogSettings(Model):
    """vLLM's per-request log lines (`--enable-log-requests`)."""

    enabled: bool = Field(True, description="log each request's id and sampling parameters (no prompt text)")
    prompts: bool = Field(
        False,
        description="also log prompt and completion text (vLLM logs prompts only at DEBUG, so this raises the "
        "engine's log level too); user data in the logs, off by default and refused by policy in prod",
    )
    max_log_len: int = Field(512, ge=0, le=65536, description="characters or token ids of a prompt or output kept in a log line")


class LogsSettings(Model):
    """A TLS log project with a topic per source, indexes, and container log collection."""

    enabled: bool = Field(
        True,
        description="TLS log project, topics (serving, gateway, platform, edge), indexes, container stdout "
        "collection, APIG access logs, and the cluster's control-plane logs into the same project",
    )
    retention_days: int = Field(30, ge=1, le=3650, description="days every topic (and control-plane log) keeps logs")
    shard_count: int = Field(2, ge=1, le=10, description="initial shards per topic (topics split automatically)")
    access_log: bool = Field(True, description="structured JSON access log of the in-cluster gateway on its stdout")
    collector_identifier: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        description="machine-group identifier the nodes' LogCollectors (the log-collector add-on) register with; "
        "<resource prefix>-nodes when unset",
    )
    request_log: RequestLogSettings = Field(default_factory=RequestLogSettings, description="vLLM request logging")


class ObservabilitySettings(Model):
    vmp_enabled: bool = Field(
        True,
        description="create a managed Prometheus (VMP) workspace; the in-cluster Prometheus remote-writes to it "
        "(needs monitoring.enabled) and the APIG edge sends its metrics there",
    )
    vmp_instance_type: str = Field("vmp.standard.15d", description="VMP workspace instance type")
    tracing: TracingSettings = Field(default_factory=TracingSettings, description="request tracing")
    logs: LogsSettings = Field(default_factory=LogsSettings, description="logs in VolcEngine's log service (TLS)")

    @model_validator(mode="after")
    def _tracing(self):
        if self.tracing.detailed and not self.tracing.enabled:
            raise ValueError("tracing.detailed: needs tracing.enabled: true (vLLM refuses detailed traces without an endpoint)")
        return self
