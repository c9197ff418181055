"""VPC with one private node subnet (and one VPC-CNI pod subnet) per zone, a node security
group that admits only in-VPC traffic, and a NAT gateway + EIP + SNAT for egress.

Nothing here has a public address except the NAT's EIP, which carries egress only: nodes
pull images and reach TOS through it (or through the in-VPC TOS endpoint) and are never
reachable from the internet.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list


@dataclass(frozen=True)
class NetworkArgs:
    vpc_cidr: str
    node_subnets: dict[str, str]  # zone -> CIDR
    pod_subnets: dict[str, str]  # zone -> CIDR (empty with Flannel)
    nat_spec: str
    egress_bandwidth_mbps: int
    project_name: str
    tags: dict[str, str]


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    node_subnet_ids: pulumi.Output[list[str]]
    pod_subnet_ids: pulumi.Output[list[str]]
    subnet_ids_by_zone: dict[str, pulumi.Output[str]]
    node_security_group_id: pulumi.Output[str]
    nat_gateway_id: pulumi.Output[str]
    egress_ip: pulumi.Output[str]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:network:Network", name, None, opts)
        tags = tag_list(args.tags)

        vpc = volc.vpc.Vpc(
            f"{name}-vpc",
            vpc_name=f"{name}-vpc",
            cidr_block=args.vpc_cidr,
            project_name=args.project_name,
            tags=tags,
            opts=child(self),
        )

        self.subnet_ids_by_zone = {}
        node_subnets = []
        for zone, cidr in args.node_subnets.items():
            subnet = volc.vpc.Subnet(
                f"{name}-nodes-{zone}",
                subnet_name=f"{name}-nodes-{zone}",
                vpc_id=vpc.id,
                zone_id=zone,
                cidr_block=cidr,
                opts=child(self),
            )
            self.subnet_ids_by_zone[zone] = subnet.id
            node_subnets.append(subnet)
        pod_subnets = [
            volc.vpc.Subnet(
                f"{name}-pods-{zone}",
                subnet_name=f"{name}-pods-{zone}",
                vpc_id=vpc.id,
                zone_id=zone,
                cidr_block=cidr,
                opts=child(self),
            )
            for zone, cidr in args.pod_subnets.items()
        ]

        # Nodes talk to each other, to pods and to the VKE control plane inside the VPC
        # only. No rule admits 0.0.0.0/0: the edge gateway reaches pods over the VPC.
        sg = volc.vpc.SecurityGroup(
            f"{name}-nodes-sg",
            security_group_name=f"{name}-nodes",
            description="VKE nodes: in-VPC ingress only",
            vpc_id=vpc.id,
            project_name=args.project_name,
            tags=tag_list(args.tags),
            opts=child(self),
        )
        volc.vpc.SecurityGroupRule(
            f"{name}-nodes-ingress-vpc",
            security_group_id=sg.id,
            direction="ingress",
            protocol="all",
            port_start=-1,
            port_end=-1,
            cidr_ip=args.vpc_cidr,
            policy="accept",
            priority=1,
            description="node, pod and control-plane traffic inside the VPC",
            opts=child(self),
        )
        volc.vpc.SecurityGroupRule(
            f"{name}-nodes-egress",
            security_group_id=sg.id,
            direction="egress",
            protocol="all",
            port_start=-1,
            port_end=-1,
            cidr_ip="0.0.0.0/0",
            policy="accept",
            priority=1,
            description="egress leaves through the NAT gateway",
            opts=child(self),
        )

        nat = volc.nat.Gateway(
            f"{name}-nat",
            nat_gateway_name=f"{name}-nat",
            vpc_id=vpc.id,
            subnet_id=node_subnets[0].id,
            spec=args.nat_spec,
            billing_type="PostPaid",
            project_name=args.project_name,
            tags=tag_list(args.tags),
            opts=child(self),
        )
        eip = volc.eip.Address(
            f"{name}-nat-eip",
            name=f"{name}-nat-eip",
            bandwidth=args.egress_bandwidth_mbps,
            billing_type="PostPaidByTraffic",
            isp="BGP",
            project_name=args.project_name,
            tags=tag_list(args.tags),
            opts=child(self),
        )
        assoc = volc.eip.Associate(
            f"{name}-nat-eip-assoc",
            allocation_id=eip.id,
            instance_id=nat.id,
            instance_type="Nat",
            opts=child(self),
        )
        for subnet in [*node_subnets, *pod_subnets]:
            volc.nat.SnatEntry(
                f"{subnet._name}-snat",
                snat_entry_name=f"{subnet._name}-snat",
                nat_gateway_id=nat.id,
                subnet_id=subnet.id,
                eip_id=eip.id,
                opts=child(self, depends_on=[assoc]),
            )

        self.vpc_id = vpc.id
        self.node_subnet_ids = pulumi.Output.all(*[s.id for s in node_subnets])
        self.pod_subnet_ids = pulumi.Output.all(*[s.id for s in pod_subnets])
        self.node_security_group_id = sg.id
        self.nat_gateway_id = nat.id
        self.egress_ip = eip.eip_address
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "node_subnet_ids": self.node_subnet_ids,
                "pod_subnet_ids": self.pod_subnet_ids,
                "node_security_group_id": self.node_security_group_id,
                "nat_gateway_id": self.nat_gateway_id,
                "egress_ip": self.egress_ip,
            }
        )
