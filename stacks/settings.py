"""The settings of a stack, as the user wrote them.

`stacks/Pulumi.<stack>.yaml` holds a single structured key, `deepseek-volc:settings`, which
is parsed into `StackSettings`: the top-level fields and one model per section
(stacks/sections/), each validating its own fields. Nothing here is derived: every
cross-section check and every decision made from the settings (subnets, pool hardware,
add-ons, names, the serving plan, SLOs) is computed once into a `StackPlan`
(stacks/plan/), which infra and workloads read.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from capacity.suggest import did_you_mean
from stacks.regions import REGION_ZONES
from stacks.sections.alerting import AlertingSettings
from stacks.sections.autoscaling import AutoscalingSettings
from stacks.sections.cluster import ClusterSettings, GpuPoolSettings, SystemPoolSettings
from stacks.sections.common import Model
from stacks.sections.gateway import GatewaySettings
from stacks.sections.monitoring import MonitoringSettings
from stacks.sections.network import NetworkSettings
from stacks.sections.observability import ObservabilitySettings
from stacks.sections.registry import RegistrySettings
from stacks.sections.resilience import ResilienceSettings
from stacks.sections.rollout import RolloutSettings
from stacks.sections.serving import ServingSettings
from stacks.sections.weights import WeightsSettings

__all__ = [
    "STACK_NAME", "AlertingSettings", "AutoscalingSettings", "ClusterSettings", "GatewaySettings",
    "GpuPoolSettings", "MonitoringSettings", "NetworkSettings", "ObservabilitySettings", "RegistrySettings",
    "ResilienceSettings", "RolloutSettings", "ServingSettings", "StackSettings", "SystemPoolSettings",
    "WeightsSettings",
]

EnvironmentClass = Literal["dev", "staging", "prod"]
# Cloud names derive from the stack name (deepseek-<stack>, deepseek-volc-<stack>-weights):
# a DNS label short enough for every name built from it (TOS buckets allow 63 characters,
# CR instances 30).
STACK_NAME = r"^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$"


class StackSettings(Model):
    stack: str = Field(
        pattern=STACK_NAME,
        description="the stack's name, set by the loader from Pulumi.<stack>.yaml (or the Pulumi stack); "
        "every cloud resource name derives from it",
    )
    environment_class: EnvironmentClass = Field(
        description="dev, staging or prod strength: chooses the policy config (and with it what the policies require)"
    )
    policy_config: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_./-]+\.json$",
        description="policy pack config, relative to the repository root; policies/config/<environment_class>.json when unset",
    )
    region: str = Field(description="VolcEngine region, e.g. cn-beijing")
    zones: list[str] = Field(min_length=1, description="availability zones the stack spans")
    project_name: str = Field("default", description="VolcEngine project the resources belong to")
    tags: dict[str, str] = Field(default_factory=dict, description="tags added to every taggable resource")
    network: NetworkSettings = Field(default_factory=NetworkSettings, description="VPC, subnets and NAT")
    cluster: ClusterSettings = Field(description="VKE cluster and node pools")
    weights: WeightsSettings = Field(default_factory=WeightsSettings, description="TOS weight store")
    registry: RegistrySettings = Field(default_factory=RegistrySettings, description="container registry")
    observability: ObservabilitySettings = Field(
        default_factory=ObservabilitySettings, description="managed Prometheus, request traces and logs"
    )
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="APIG edge")
    serving: ServingSettings = Field(description="the vLLM serving workload")
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings, description="replica autoscaling")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="canary rollout")
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings, description="metrics and alerts")
    resilience: ResilienceSettings = Field(
        default_factory=ResilienceSettings, description="GPU node health, pre-warm and warm capacity"
    )
    alerting: AlertingSettings = Field(default_factory=AlertingSettings, description="alert receivers and routing")
    accept_replacements: list[str] = Field(
        default_factory=list,
        description="names of stateful resources this change may replace or delete (cluster, bucket, registry, "
        "APIG gateway, HPC cluster, role, VMP workspace); `dsvolc preview STACK --against REF` refuses any other",
    )

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if v not in REGION_ZONES:
            raise ValueError(f"expected one of {', '.join(REGION_ZONES)}, got {v!r}{did_you_mean(v, REGION_ZONES)}")
        return v

    @model_validator(mode="after")
    def _zones(self):
        known = REGION_ZONES[self.region]
        for i, zone in enumerate(self.zones):
            if zone not in known:
                raise ValueError(f"zones[{i}]: {zone!r} is not a zone of {self.region}; expected one of "
                                 f"{', '.join(known)}{did_you_mean(zone, known)}")
        if len(set(self.zones)) != len(self.zones):
            raise ValueError("zones: expected distinct zones")
        return self
