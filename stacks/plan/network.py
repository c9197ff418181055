"""The network plan: node and pod subnets per zone (as given, or carved from the VPC), and
where NAT egress leaves; refused where VolcEngine would refuse it."""

from __future__ import annotations

import ipaddress
from types import MappingProxyType

from stacks.errors import Refusal
from stacks.plan.types import NetworkPlan
from stacks.sections.common import cidr_problem
from stacks.settings import StackSettings

# Internet NAT gateways one VPC holds (BytePlus NAT gateway FAQ, "How many Internet NAT
# Gateways can I create in a Virtual Private Cloud?": up to three;
# https://docs.byteplus.com/en/docs/natgateway/NAT-gateway-FAQ).
NAT_GATEWAYS_PER_VPC = 3
NAT_FAQ = "https://docs.byteplus.com/en/docs/natgateway/NAT-gateway-FAQ"


def node_subnets(s: StackSettings) -> dict[str, ipaddress.IPv4Network]:
    """Node subnet per zone: as given, else consecutive /20s (or smaller for small VPCs) from the VPC start."""
    if s.network.subnets:
        return {z: s.network.subnets[z] for z in s.zones}
    vpc = s.network.vpc_cidr
    size = min(max(vpc.prefixlen + 4, 20), 28)
    blocks = vpc.subnets(new_prefix=size)
    return {z: next(blocks) for z in s.zones}


def pod_subnets(s: StackSettings) -> dict[str, ipaddress.IPv4Network]:
    """VPC-CNI pod subnet per zone: as given, else /19-sized blocks from the VPC's upper half."""
    if s.network.pod_subnets:
        return {z: s.network.pod_subnets[z] for z in s.zones}
    vpc = s.network.vpc_cidr
    upper = list(vpc.subnets(prefixlen_diff=1))[1]
    size = min(max(upper.prefixlen + 2, 19), 28)
    blocks = upper.subnets(new_prefix=size)
    return {z: next(blocks) for z in s.zones}


def nat_mode(s: StackSettings) -> str:
    """per_zone or shared: the setting, else shared for the dev class and per_zone otherwise."""
    if s.network.nat is not None:
        return s.network.nat
    return "shared" if s.environment_class == "dev" else "per_zone"


def plan_network(s: StackSettings) -> NetworkPlan:
    net, vpc = s.network, s.network.vpc_cidr
    vpc_cni = s.cluster.pod_network_mode == "VpcCniShared"
    for key in ("subnets", "pod_subnets"):
        given = getattr(net, key)
        if given and set(given) != set(s.zones):
            raise Refusal(
                f"network.{key}: expected one entry per stack zone ({', '.join(s.zones)}), got {', '.join(given)}"
            )
    nodes = node_subnets(s)
    pods = pod_subnets(s) if vpc_cni else {}
    blocks = [(f"network.subnets.{z}", c) for z, c in nodes.items()]
    blocks += [(f"network.pod_subnets.{z}", c) for z, c in pods.items()]
    for path, cidr in blocks:
        problem = cidr_problem(cidr, "volcengine:vpc/subnet:Subnet", "cidrBlock", "a VolcEngine subnet")
        if problem:
            raise Refusal(f"{path}: {problem}")
        if not cidr.subnet_of(vpc):
            raise Refusal(f"{path}: {cidr} is outside network.vpc_cidr {vpc}")
    for i, (path_a, a) in enumerate(blocks):
        for path_b, b in blocks[i + 1 :]:
            if a.overlaps(b):
                raise Refusal(f"{path_a}: {a} overlaps {path_b} {b}")
    if not vpc_cni:
        if net.flannel_pod_cidr.overlaps(vpc):
            raise Refusal(f"network.flannel_pod_cidr: {net.flannel_pod_cidr} overlaps network.vpc_cidr {vpc}")
        if net.flannel_pod_cidr.overlaps(net.service_cidr):
            raise Refusal(
                f"network.flannel_pod_cidr: {net.flannel_pod_cidr} overlaps network.service_cidr {net.service_cidr}"
            )
    mode = nat_mode(s)
    if mode == "shared" and s.environment_class != "dev":
        raise Refusal(
            f"network.nat: 'shared' puts one NAT gateway in {s.zones[0]} for every zone: losing that zone "
            f"cuts egress (TOS, STS, the registry) for the whole cluster. It is for dev-class stacks; expected "
            f"per_zone for a {s.environment_class} stack (or leave it unset)")
    if mode == "per_zone" and len(s.zones) > NAT_GATEWAYS_PER_VPC:
        raise Refusal(
            f"network.nat: per_zone needs a NAT gateway in each of {len(s.zones)} zones, but a VPC holds at most "
            f"{NAT_GATEWAYS_PER_VPC} Internet NAT gateways ({NAT_FAQ}); expected at most {NAT_GATEWAYS_PER_VPC} "
            "zones")
    return NetworkPlan(
        node_subnets=MappingProxyType(nodes),
        pod_subnets=MappingProxyType(pods),
        vpc_cni=vpc_cni,
        nat_mode=mode,
        nat_zones=tuple(s.zones) if mode == "per_zone" else tuple(s.zones[:1]),
    )
