"""VolcEngine regions and zones, and the VKE Kubernetes versions we accept.

Kept as data so that a typo in a zone or version is refused before anything reaches the
cloud (the provider would only fail minutes into `pulumi up`).
"""

from __future__ import annotations

# Zones of the regions this project deploys to. Zone ids have the form <region>-<letter>
# (ap-southeast-1 drops the dash). Extend this table when VolcEngine opens a zone.
REGION_ZONES: dict[str, tuple[str, ...]] = {
    "cn-beijing": ("cn-beijing-a", "cn-beijing-b", "cn-beijing-c", "cn-beijing-d"),
    "cn-shanghai": ("cn-shanghai-a", "cn-shanghai-b", "cn-shanghai-c"),
    "cn-guangzhou": ("cn-guangzhou-a", "cn-guangzhou-b", "cn-guangzhou-c"),
    "ap-southeast-1": ("ap-southeast-1a", "ap-southeast-1b"),
}

# VKE release notes (docs 6460/101027) list v1.34, v1.32, v1.30 and v1.28 (scheduled for
# EOL); v1.26 and older are end of life and cannot be created any more.
SUPPORTED_KUBERNETES_VERSIONS: tuple[str, ...] = ("1.28", "1.30", "1.32", "1.34")
DEPRECATED_KUBERNETES_VERSIONS: frozenset[str] = frozenset({"1.28"})


def tos_s3_endpoint(region: str) -> str:
    """TOS's S3-compatible endpoint, used by S3 clients such as vLLM's runai_streamer."""
    return f"https://tos-s3-{region}.volces.com"


def tos_endpoint_host(region: str) -> str:
    """TOS's native endpoint host (also what egress policies must allow)."""
    return f"tos-{region}.volces.com"


def tos_internal_endpoint(region: str) -> str:
    """TOS's native endpoint inside the VPC (no NAT traffic, no egress charge)."""
    return f"https://tos-{region}.ivolces.com"


def tos_internal_s3_host(region: str) -> str:
    """The in-VPC S3 endpoint host: traffic to it stays on the private network."""
    return f"tos-s3-{region}.ivolces.com"


def cr_registry_host(registry: str, region: str) -> str:
    """Host of a CR Enterprise registry instance."""
    return f"{registry}-{region}.cr.volces.com"


def tls_otlp_endpoint(region: str) -> str:
    """OTLP/HTTP ingest of TLS trace instances (the exporter appends /v1/traces). Spans are
    routed to a trace topic by the x-tls-otel-tracetopic header and authenticated with
    x-tls-otel-ak / x-tls-otel-sk / x-tls-otel-region (volcengine/veadk-python, commit
    0ed93912, veadk/consts.py DEFAULT_TLS_OTEL_EXPORTER_ENDPOINT and
    veadk/tracing/telemetry/exporters/tls_exporter.py; TLS endpoints per region: docs
    6470/73641)."""
    return f"https://tls-{region}.volces.com:4318"


def apmplus_otlp_endpoint(region: str) -> str:
    """OTLP/HTTP ingest of APMPlus, authenticated with the X-ByteAPM-AppKey header
    (volcengine/veadk-python docs: observability.opentelemetry.apmplus endpoint
    https://apmplus-cn-beijing.volces.com:4318; volcengine/veadk-go NewAPMPlusExporter)."""
    return f"https://apmplus-{region}.volces.com:4318"


def tls_console(region: str) -> str:
    """The TLS console of a region (log search and trace instances)."""
    return f"https://console.volcengine.com/tls/region:tls+{region}/"
