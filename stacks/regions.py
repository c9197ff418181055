"""VolcEngine regions and zones, and the VKE Kubernetes versions we accept.

Kept as data so that a typo in a zone or version is refused before anything reaches the
cloud (the provider would only fail minutes into `pulumi up`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from capacity.instances import Sighting, get_instance_type

VKE_REGION_GUIDE = "https://www.volcengine.com/docs/6460/79643"
REGION_GUIDE = "https://www.volcengine.com/docs/6534/1131814"
_VKE = (f"VKE region and zone guide ({VKE_REGION_GUIDE}, updated 2025-09-30; read through a public "
        "snapshot of its table, GitHub code index file id 55923984717)")


@dataclass(frozen=True)
class Zone:
    id: str
    source: str


def _zones(*ids: str, source: str = _VKE) -> tuple[Zone, ...]:
    return tuple(Zone(z, source) for z in ids)


# Zones of the regions this project deploys to, each with where it was read. Zone ids have
# the form <region>-<letter> (ap-southeast-* drops the dash). Extend this table, with the
# source, when VolcEngine opens a zone; a stack naming a zone not listed here is refused.
REGIONS: dict[str, tuple[Zone, ...]] = {
    "cn-beijing": (
        *_zones("cn-beijing-a", "cn-beijing-b", "cn-beijing-c", "cn-beijing-d"),
        # The general region guide (REGION_GUIDE) counts 9 zones in cn-beijing; VKE's page
        # listed a-d on 2025-09-30. cn-beijing-e hosts H20 (hpcpni3ln) capacity in public use.
        Zone("cn-beijing-e", f"general region guide ({REGION_GUIDE}: 9 zones in cn-beijing); "
             "ML-platform H20 queue in zone cn-beijing-e (GitHub code index, file ids 55127256013, "
             "55229239106); check VKE offers it with vke.get_support_resource_types"),
    ),
    "cn-shanghai": _zones("cn-shanghai-a", "cn-shanghai-b", "cn-shanghai-c", "cn-shanghai-d", "cn-shanghai-e"),
    "cn-guangzhou": _zones("cn-guangzhou-a", "cn-guangzhou-b", "cn-guangzhou-c"),
    "cn-hongkong": _zones("cn-hongkong-a", "cn-hongkong-b"),
    "ap-southeast-1": _zones("ap-southeast-1a", "ap-southeast-1b", "ap-southeast-1c"),
    "ap-southeast-3": _zones("ap-southeast-3a", "ap-southeast-3b", "ap-southeast-3c"),
}
REGION_ZONES: dict[str, tuple[str, ...]] = {r: tuple(z.id for z in zs) for r, zs in REGIONS.items()}


def zone_source(zone: str) -> str | None:
    for zones in REGIONS.values():
        for z in zones:
            if z.id == zone:
                return z.source
    return None


# -- where GPU instance types are sold ------------------------------------------------------
# VolcEngine publishes the regions and zones of each instance family on client-rendered pages
# ("实例规格族", docs 6396) and through ecs DescribeAvailableResource; neither was readable
# here. capacity.instances records where public sources show each type running (seen_in).
# NOT_SOLD holds (instance type, region) pairs a source states are not sold, with that source:
# no source read on 2026-12-01 states that of any type, so it is empty and nothing is refused
# on availability alone; a region with no sighting gets a PlacementWarning instead.
NOT_SOLD: dict[tuple[str, str], str] = {}


class PlacementWarning(UserWarning):
    """A GPU pool is placed where no source shows its instance type (availability unknown)."""


def where_sold(instance_type: str) -> tuple[Sighting, ...] | None:
    """The regions (with zones where a source names them) an instance type is known in;
    None for a type the GPU instance catalog does not hold."""
    rec = get_instance_type(instance_type)
    return None if rec is None else rec.seen_in


def _seen(sightings: tuple[Sighting, ...]) -> str:
    if not sightings:
        return "no source found names a region for it"
    parts = [f"{s.region} ({', '.join(s.zones)})" if s.zones else s.region for s in sightings]
    return "seen in " + "; ".join(dict.fromkeys(parts))


def refuse_unsold(pool_path: str, instance_type: str, region: str, zones: list[str]) -> None:
    """Refuse a pool whose instance type a source says is not sold in `region` (ValueError
    naming `<pool_path>.instance_type` and where the type is known); warn (PlacementWarning)
    when no source shows it there. Zones are reported, not checked: one zone seen says
    nothing about the others."""
    key = instance_type.strip().lower()
    sightings = where_sold(key)
    known = _seen(sightings or ())
    if (key, region) in NOT_SOLD:
        raise ValueError(f"{pool_path}.instance_type: {instance_type} is not sold in {region} "
                         f"({NOT_SOLD[(key, region)]}); expected a region where it is sold: {known}")
    if sightings is None:
        return  # not catalogued: the pool states gpu and gpus_per_node; nothing is recorded
    if not any(s.region == region for s in sightings):
        warnings.warn(f"{pool_path}.instance_type: no source shows {instance_type} in {region} "
                      f"(zones {', '.join(zones)}); {known}. A real `pulumi preview` asks VolcEngine "
                      "(ecs DescribeAvailableResource) and refuses a zone that does not sell it",
                      PlacementWarning, stacklevel=2)


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
