"""`network`: the VPC, node and pod subnets, NAT egress."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator, model_validator

from stacks.sections.common import _C, VKE_CLUSTER, Cidr, Model, NatSpec, cidr_problem

# The NAT gateways' EIPs are billed by traffic (infra/network.py): the bandwidth range the
# API accepts for that billing type.
EIP_TRAFFIC_MAX_MBPS = dict(_C.argument("volcengine:eip/address:Address", "bandwidth").range_when[1])["PostPaidByTraffic"][1]


class NetworkSettings(Model):
    vpc_cidr: Cidr = Field(ipaddress.IPv4Network("10.20.0.0/16"), description="CIDR of the VPC")
    subnets: dict[str, Cidr] = Field(
        default_factory=dict,
        description="node subnet per zone (zone id -> CIDR); derived as /20 blocks of the VPC when empty",
    )
    pod_subnets: dict[str, Cidr] = Field(
        default_factory=dict,
        description="VPC-CNI pod subnet per zone; derived as /19 blocks of the VPC's upper half when empty",
    )
    service_cidr: Cidr = Field(
        ipaddress.IPv4Network("172.30.0.0/18"), description="Kubernetes service CIDR (must not overlap the VPC)"
    )
    flannel_pod_cidr: Cidr = Field(
        ipaddress.IPv4Network("172.16.0.0/16"), description="pod CIDR when the pod network mode is Flannel"
    )
    nat: Literal["per_zone", "shared"] | None = Field(
        None,
        description="NAT gateways for egress: per_zone (a NAT gateway, EIP and route table in every zone, so "
        "losing a zone cuts no other zone's egress to TOS, STS or the registry) or shared (one NAT gateway in "
        "the first zone for every subnet: cheaper, for dev-class stacks only); per_zone, or shared for the dev "
        "class, when unset",
    )
    nat_spec: NatSpec = Field("Small", description="NAT gateway specification (as the provider accepts it)")
    egress_bandwidth_mbps: int = Field(
        100, ge=1, le=EIP_TRAFFIC_MAX_MBPS,
        description="EIP bandwidth of each NAT gateway (each zone's with per_zone), Mbit/s; billed by traffic"
    )
    endpoint_cidrs: list[Cidr] = Field(
        default_factory=list,
        description="address ranges of the TOS and STS endpoints the serving pods reach over HTTPS (what "
        "tos-<region>.ivolces.com and the STS endpoint resolve to in the VPC); when set, the serving pods' "
        "HTTPS egress is limited to them, else it may reach any address outside the cluster's ranges",
    )

    # What VolcEngine takes for each range (provider contract); the subnets are checked
    # against the stack's zones and the VPC in the plan (stacks/plan/network.py).
    @field_validator("vpc_cidr")
    @classmethod
    def _vpc(cls, v: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
        return _accepted(v, "volcengine:vpc/vpc:Vpc", "cidrBlock", "a VolcEngine VPC")

    @field_validator("service_cidr")
    @classmethod
    def _service(cls, v: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
        return _accepted(v, VKE_CLUSTER, "servicesConfig.serviceCidrsv4s", "a VKE service CIDR")

    @field_validator("flannel_pod_cidr")
    @classmethod
    def _flannel(cls, v: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
        return _accepted(v, VKE_CLUSTER, "podsConfig.flannelConfig.podCidrs", "a VKE Flannel pod CIDR")

    @model_validator(mode="after")
    def _service_outside_vpc(self):
        if self.service_cidr.overlaps(self.vpc_cidr):
            raise ValueError(f"service_cidr: {self.service_cidr} overlaps network.vpc_cidr {self.vpc_cidr}")
        return self


def _accepted(cidr: ipaddress.IPv4Network, resource_type: str, argument: str, what: str) -> ipaddress.IPv4Network:
    problem = cidr_problem(cidr, resource_type, argument, what)
    if problem:
        raise ValueError(problem)
    return cidr
