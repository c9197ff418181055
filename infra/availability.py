"""Where a GPU instance type is sold, asked of VolcEngine itself before any pool is created.

ECS DescribeAvailableResource (the provider's `ecs.get_available_resources`,
volcengine/ecs/ecs_available_resource/service_volcengine_ecs_available_resource.go:38 at
v0.0.194) lists, per zone of the provider's region, each instance type with its status
(`Available` or `SoldOut`). A GPU pool whose type is not `Available` in every zone it is
placed in would fail at node creation, long after the VPC and the cluster exist; the
program refuses it at `pulumi preview` instead, naming the setting and where the type is
sold.

The offline preview has no account: its mock engine answers from the catalog's cited
sightings (capacity/instances.py `seen_in`, dsvolc/engine.py), so a type seen nowhere in the
region is refused there too. stacks/regions.py's warning covers the same ground from the
settings alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

DESCRIBE = "ECS DescribeAvailableResource (ecs.get_available_resources)"


@dataclass(frozen=True)
class PoolPlacement:
    pool: str  # the pool's key in cluster.gpu_pools
    instance_type: str
    zones: tuple[str, ...]


def available_zones(instance_type: str, provider: pulumi.ProviderResource) -> dict[str, str]:
    """zone -> status of `instance_type` in the provider's region, as VolcEngine reports it."""
    found = volc.ecs.get_available_resources(destination_resource="InstanceType", instance_type_id=instance_type,
                                             opts=pulumi.InvokeOptions(provider=provider))
    out: dict[str, str] = {}
    for zone in found.available_zones or []:
        for res in zone.available_resources or []:
            if res.type != "InstanceType":
                continue
            for sr in res.supported_resources or []:
                if sr.value == instance_type:
                    out[zone.zone_id] = sr.status
    return out


def refusals(placements: list[PoolPlacement], answers: dict[str, dict[str, str]], region: str) -> list[str]:
    """What is wrong with each pool's placement, given `answers` (type -> zone -> status)."""
    out = []
    for p in placements:
        status = answers.get(p.instance_type, {})
        missing = [z for z in p.zones if status.get(z) != "Available"]
        if not missing:
            continue
        sold = sorted(z for z, s in status.items() if s == "Available")
        where = f"it is available in {', '.join(sold)}" if sold else f"no zone of {region} offers it"
        out.append(f"cluster.gpu_pools.{p.pool}.instance_type: {p.instance_type} is not available in "
                   f"{', '.join(missing)} ({DESCRIBE}: {where}). Fix: place the pool in zones that sell it "
                   f"(cluster.gpu_pools.{p.pool}.zones, or the stack's zones), or choose an instance type sold "
                   "there (docs/infrastructure.md, GPU availability).")
    return out


def require_available(placements: list[PoolPlacement], region: str, provider: pulumi.ProviderResource) -> None:
    """Raise before anything registers when a pool's type is not sold where it is placed."""
    answers = {t: available_zones(t, provider) for t in sorted({p.instance_type for p in placements})}
    problems = refusals(placements, answers, region)
    if problems:
        raise pulumi.RunError("; ".join(problems))
