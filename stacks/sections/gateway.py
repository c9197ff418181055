"""`gateway`: the APIG edge in front of the cluster (TLS, retries, canary weight)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from stacks.sections.common import ApigInstanceSpec, Model


class AbHeader(Model):
    name: str = Field("x-deepseek-variant", pattern=r"^[a-z0-9-]+$", description="request header that selects the B variant")
    value: str = Field("canary", min_length=1, description="header value routed to the canary")


# APIG's retry conditions (terraform-provider-volcengine volcengine/apig/apig_route at 8cff1813).
RetryOn = Literal["5xx", "reset", "connect-failure", "refused-stream", "cancelled", "deadline-exceeded",
                  "internal", "resource-exhausted", "unavailable"]
# The conditions under which nothing reached an engine: the connection was never made, or
# the upstream refused the stream before processing it (HTTP/2 REFUSED_STREAM).
RETRY_BEFORE_ENGINE = ("connect-failure", "refused-stream")
# APIG takes one or two subnets (terraform-provider-volcenginecc docs/resources/apig_gateway.md
# at 3a525a11: subnet_ids "Length limit: 1-2"); replicas 2-100; public bandwidth 0-500 Mbps.
APIG_MAX_SUBNETS = 2
HOSTNAME = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$"


class EdgeRetrySettings(Model):
    enabled: bool = Field(True, description="retry failed requests at the edge")
    attempts: int = Field(2, ge=1, le=10, description="retries after the first try (APIG attempts)")
    per_try_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=3600,
        description="seconds one try may take; sent to APIG in milliseconds (x 1000); none when unset, so a long "
        "generation is never cut off by a retry timer (retries only fire before anything reached an engine)",
    )
    retry_on: list[RetryOn] = Field(
        default_factory=lambda: ["connect-failure", "refused-stream"],
        min_length=1,
        description="conditions that trigger a retry (APIG retry_on), only those where the request reached no "
        "engine: connect-failure, refused-stream; the others ('5xx', 'reset', ...) also fire after a generation "
        "began, which a retry would run twice",
    )
    http_codes: list[int] = Field(
        default_factory=lambda: [503],
        description="response status codes that trigger a retry, e.g. 503 from a draining pod (sent as strings)",
    )

    @field_validator("retry_on")
    @classmethod
    def _before_engine(cls, v: list[str]) -> list[str]:
        bad = [c for c in v if c not in RETRY_BEFORE_ENGINE]
        if bad:
            raise ValueError(f"{bad} may fire after the request reached an engine (a generation is not idempotent); "
                             f"expected only {list(RETRY_BEFORE_ENGINE)}")
        return v

    @field_validator("http_codes")
    @classmethod
    def _codes(cls, v: list[int]) -> list[int]:
        bad = [c for c in v if not 500 <= c <= 599]
        if bad:
            raise ValueError(f"expected 5xx status codes (500-599), got {bad}")
        return v


class EdgeTlsSettings(Model):
    domain: str = Field(pattern=HOSTNAME, max_length=253, description="public API host name the edge serves (lower case)")
    certificate_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{2,127}$",
        description="id of the domain's certificate in VolcEngine's certificate service (upload it there or have "
        "it issued there)",
    )
    plain_http: Literal["closed", "redirect"] = Field(
        "closed",
        description="plain HTTP on the public service: closed (no HTTP listener), or redirect (HTTP answered with a "
        "redirect to HTTPS; a token sent over HTTP has already crossed the network)",
    )


# Triton's OpenAI frontend starts uvicorn with a fixed keep-alive of 5 s and takes no flag
# for it (triton-inference-server/server python/openai/openai_frontend/frontend/
# fastapi_frontend.py, `timeout_keep_alive=5`).
TRITON_KEEPALIVE_SECONDS = 5
# How much sooner than the engine the proxies close an idle upstream connection: longer
# than a request's transit from a proxy to an engine and the timers' slack, so a proxy
# never sends on a connection the engine is closing.
KEEPALIVE_MARGIN_SECONDS = 2


class ProxySettings(Model):
    """The in-cluster Envoy proxies (serving.in_cluster_gateway): how many, and what they
    admit. The planned concurrency is the requests the engines run at once at the
    autoscaler's ceiling: max replicas x engines per replica x max_num_seqs."""

    requests_per_proxy: int = Field(
        4096, ge=64, le=65536,
        description="in-flight requests one proxy is planned to carry (one upstream connection each: vLLM speaks "
        "HTTP/1.1); the proxy count is the planned concurrency x breaker_headroom over this, plus one spare, and "
        "at least serving.gateway_replicas",
    )
    breaker_headroom: float = Field(
        2.0, ge=1.0, le=10.0,
        description="the proxies' circuit breaker admits this many times the planned concurrency, with one proxy "
        "down: the requests above the engines' batch wait in the engines' own queue (the autoscaler's signal) "
        "instead of being refused at the gateway",
    )
    engine_keepalive_seconds: int = Field(
        60, ge=5, le=3600,
        description="how long an engine keeps an idle HTTP connection open (vLLM VLLM_HTTP_TIMEOUT_KEEP_ALIVE, "
        "5 s by default; Triton's frontend is fixed at 5 s); the proxies close theirs "
        f"{KEEPALIVE_MARGIN_SECONDS} s sooner (BackendTrafficPolicy connectionIdleTimeout), so they never reuse a "
        "connection the engine closed",
    )


class GatewaySettings(Model):
    edge_enabled: bool = Field(True, description="create the APIG gateway in front of the cluster")
    instance_spec: ApigInstanceSpec = Field("1c2g", description="APIG instance specification")
    replicas: int = Field(2, ge=2, le=100, description="APIG gateway replicas (APIG accepts 2-100)")
    public_bandwidth_mbps: int = Field(
        50, ge=1, le=500, description="public bandwidth of the edge listener in Mbps (APIG accepts up to 500)"
    )
    zones: list[str] | None = Field(
        None,
        min_length=1,
        max_length=APIG_MAX_SUBNETS,
        description="stack zones whose node subnets the APIG gateway uses (APIG accepts 1-2 subnets); the first "
        "two stack zones when unset",
    )
    canary_weight: int = Field(0, ge=0, le=100, description="percent of traffic sent to the canary track")
    ab_header: AbHeader = Field(default_factory=AbHeader, description="header-based A/B routing to the canary")
    request_timeout_seconds: int = Field(
        600, ge=10, le=3600,
        description="longest a response may stay silent: all of a non-streamed completion (it sends nothing until "
        "done), or the gap between two chunks of a stream; streams have no total timeout behind the in-cluster "
        "gateway (an edge-only stack cuts every request at this total)",
    )
    retry: EdgeRetrySettings = Field(default_factory=EdgeRetrySettings, description="edge retries (units in the names)")
    proxies: ProxySettings = Field(
        default_factory=ProxySettings,
        description="the in-cluster Envoy proxies: count, circuit breaker and upstream keep-alive from the engine plan",
    )
    tls: EdgeTlsSettings | None = Field(
        None, description="HTTPS on the public service: domain and certificate; required when edge_enabled"
    )

    @model_validator(mode="after")
    def _edge(self):
        if self.edge_enabled and self.tls is None:
            raise ValueError("tls: required when edge_enabled: the public edge serves HTTPS only (clients send bearer "
                             "tokens); set tls.domain and tls.certificate_id, or edge_enabled: false")
        per_try = self.retry.per_try_timeout_seconds
        if per_try is not None and per_try > self.request_timeout_seconds:
            raise ValueError(f"retry.per_try_timeout_seconds: {per_try} exceeds request_timeout_seconds "
                             f"({self.request_timeout_seconds}); a try cannot outlive the request")
        return self
