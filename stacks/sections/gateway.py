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
        description="seconds one try may take; sent to APIG in milliseconds (x 1000); gateway.request_timeout_seconds "
        "when unset, so a long generation is never cut off by a retry timer",
    )
    retry_on: list[RetryOn] = Field(
        default_factory=lambda: ["connect-failure", "refused-stream", "reset"],
        min_length=1,
        description="conditions that trigger a retry (APIG retry_on); '5xx' would also retry after an upstream "
        "error that may come mid-generation",
    )
    http_codes: list[int] = Field(
        default_factory=lambda: [503],
        description="response status codes that trigger a retry, e.g. 503 from a draining pod (sent as strings)",
    )

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
    request_timeout_seconds: int = Field(600, ge=10, le=3600, description="edge timeout in seconds (long generations)")
    retry: EdgeRetrySettings = Field(default_factory=EdgeRetrySettings, description="edge retries (units in the names)")
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
